"""The one place mhalab reads Lightning's private names, each where Lightning has no public way to ask.

Checked on lightning 2.6.6 (pyproject caps lightning below 2.7 for these three): exact resume needs Lightning's own
answers, not recomputations from its public settings, which differ for iterable data, a requested early stop and
a time-based `val_check_interval`.
"""

from __future__ import annotations


def validation_due(trainer) -> bool:
    """Whether Lightning validates right after the current training batch (its own predicate).

    A checkpoint must not be taken at such a batch's end: restoring one, Lightning assumes the validation that
    followed it already ran and skips it. The validation end writes the checkpoint instead."""
    loop = trainer.fit_loop
    return bool(loop.epoch_loop._should_check_val_fx(loop._data_fetcher))


def logs_due(trainer) -> bool:
    """Whether Lightning's loggers write step metrics after the current batch (`log_every_n_steps`, or a stop)."""
    return bool(trainer._logger_connector.should_update_logs)


def restart_training_iterator(trainer) -> None:
    """On a resumed fit, a fresh training iterator. Lightning made it before it restored the checkpoint (to count
    the steps), so worker processes already drew indices from the start of epoch 0; a fresh one asks the sampler for
    the restored position (mhalab.data.sampling.EpochSampler), so the run continues where it stopped."""
    loop = trainer.fit_loop
    if loop.restarting and loop._data_fetcher is not None:
        iter(loop._data_fetcher)
