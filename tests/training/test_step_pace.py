"""A step at the plain loop's pace changes no result (issue 26): train/acc's argmax on the predicted rows counts what
it counted over every row, ties included; deterministic CPU training without torch's NaN fill of new tensors gives
the same logged figures, weights and optimiser state bit for bit as with it, and the setting is restored after."""

from types import SimpleNamespace

import pytest
import torch

from mhalab.training.evaluation import IGNORE_INDEX, batch_correct
from mhalab.training.module import without_nan_fill


def _reference(logits, labels):
    """train/acc's (correct, count) as counted before: the argmax of every row."""
    valid = labels != IGNORE_INDEX
    return int(((logits.argmax(-1) == labels) & valid).sum()), int(valid.sum())


@pytest.mark.parametrize("every", [1, 3, 8])  # every row predicted, a third, one in 8 (MQAR's 4 of 32)
def test_train_accuracy_on_the_predicted_rows_counts_what_every_row_counted(every):
    g = torch.Generator().manual_seed(every)
    logits = torch.randint(0, 3, (960, 7), generator=g).float()  # few distinct values: ties for the maximum
    labels = torch.randint(0, 7, (960,), generator=g)
    keep = torch.zeros(960, dtype=torch.bool)
    keep[::every] = True
    labels[~keep] = IGNORE_INDEX
    sums = batch_correct(logits, labels)
    correct, count = _reference(logits, labels)
    assert sums.dtype == torch.float64 and sums.tolist() == [0.0, correct, count, 0.0]
    assert 0 < correct < count  # the case checks something: some rows right, some wrong


def test_train_accuracy_of_a_batch_with_nothing_predicted_is_zero_of_zero():
    labels = torch.full((5,), IGNORE_INDEX)
    assert batch_correct(torch.randn(5, 3), labels).tolist() == [0.0, 0.0, 0.0, 0.0]


def _trainer(device: str):
    return SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device(device)))


@pytest.mark.parametrize("device,deterministic,inside", [("cpu", True, False), ("cpu", False, True),
                                                         ("cuda", True, True)])
def test_the_nan_fill_is_off_only_for_deterministic_cpu_training_and_restored(device, deterministic, inside):
    was = torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(deterministic)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        with pytest.raises(KeyboardInterrupt):  # restored also when training stops with an exception
            with without_nan_fill(_trainer(device)):
                assert torch.utils.deterministic.fill_uninitialized_memory is inside
                raise KeyboardInterrupt
        assert torch.utils.deterministic.fill_uninitialized_memory is True
    finally:
        torch.use_deterministic_algorithms(was[0])
        torch.utils.deterministic.fill_uninitialized_memory = was[1]


def _run(train, root, fill: bool, task: list[str]):
    """A real in-process `mhalab train` (deterministic, the default); `fill`: with torch's NaN fill, as before."""
    import mhalab.training.module as module

    seen = set()
    step = module.AttentionLitModule.training_step

    def spy(self, batch, batch_idx):
        seen.add((torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory))
        return step(self, batch, batch_idx)

    with pytest.MonkeyPatch.context() as mp:
        if fill:
            mp.setattr(module, "without_nan_fill", lambda trainer: _Nothing())
        mp.setattr(module.AttentionLitModule, "training_step", spy)
        r = train(*task, "trainer.max_epochs=2", "trainer.limit_train_batches=4", root=root)
    assert r.returncode == 0, r.stderr[-3000:]
    assert seen == {(True, fill)}  # what the steps ran with
    (run_dir,) = (root / "logs" / "train" / "runs").iterdir()
    return run_dir


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("task", [[], ["data=mqar", "data.mqar.n_train=96", "data.mqar.n_val=32",
                                       "data.mqar.n_test=32"]], ids=["bbc_news", "mqar"])
def test_training_without_the_nan_fill_gives_the_same_figures_bit_for_bit(train, tmp_path, task):
    from mhalab.runs.summary import read_summary

    before = _run(train, tmp_path / "fill", True, task)
    after = _run(train, tmp_path / "nofill", False, task)
    assert torch.utils.deterministic.fill_uninitialized_memory is True  # restored after the run
    csv_before, csv_after = ((d / "csv" / "metrics.csv").read_text() for d in (before, after))
    assert "train/acc" in csv_before.splitlines()[0] and csv_after == csv_before
    a, b = read_summary(before), read_summary(after)
    assert (a.metrics, a.test_metrics, a.history, a.head_stats) == (b.metrics, b.test_metrics, b.history, b.head_stats)
    ca, cb = (torch.load(d / "checkpoints" / "last.ckpt", weights_only=False) for d in (before, after))
    assert ca["state_dict"].keys() == cb["state_dict"].keys()
    assert all(torch.equal(ca["state_dict"][k], cb["state_dict"][k]) for k in ca["state_dict"])
    sa, sb = ca["optimizer_states"][0]["state"], cb["optimizer_states"][0]["state"]
    assert sa.keys() == sb.keys() and all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i])
