"""One progress line per training step at most (issue 28): when the heartbeat (a line after `heartbeat_s` of
silence) and the regular line every `every_n_steps` fall on the same step, the step is printed once; a heartbeat
during a step already printed says how long the next step has run instead of repeating the line."""

import logging
import re
import time
from types import SimpleNamespace

import pytest

from mhalab.training.callbacks import ProgressLog
from mhalab.training.console import HEARTBEAT

STEP = re.compile(r"^step (\d+)/")


@pytest.fixture
def lines():
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    logger = logging.getLogger("mhalab")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield said
    logger.removeHandler(handler)
    logger.setLevel(old_level)
    HEARTBEAT.interval = 30.0


def wait_until(found, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found():
            return
        time.sleep(0.01)
    raise AssertionError("timed out")


def test_the_heartbeat_and_the_regular_line_of_one_step_print_one_line(lines):
    trainer = SimpleNamespace(global_step=0, is_global_zero=True, estimated_stepping_batches=200, current_epoch=0,
                              callback_metrics={}, sanity_checking=False)
    module = SimpleNamespace(tokens_seen=0)
    progress = ProgressLog(every_n_steps=50, heartbeat_s=0.2)
    progress.on_train_start(trainer, module)
    try:
        # step 50 has ended (Lightning counted it) but its batch-end callback has not run yet: the heartbeat speaks
        trainer.global_step = 50
        wait_until(lambda: any(STEP.match(s) for s in lines))
        progress.on_train_batch_end(trainer, module, None, None, 49)  # the regular line of step 50: said already
        assert [s for s in lines if STEP.match(s)] == [lines[0]] and STEP.match(lines[0]).group(1) == "50", lines
        # step 100: the regular line first, then a heartbeat while step 101 runs: no second "step 100/" line
        trainer.global_step = 100
        progress.on_train_batch_end(trainer, module, None, None, 99)
        wait_until(lambda: any("has run" in s for s in lines))
        steps = [STEP.match(s).group(1) for s in lines if STEP.match(s)]
        assert steps == ["50", "100"], lines
        assert re.fullmatch(r"training: the step after step 100 has run \d+ s", lines[-1]), lines
        # the next step is printed again as usual
        trainer.global_step = 150
        progress.on_train_batch_end(trainer, module, None, None, 149)
        assert [STEP.match(s).group(1) for s in lines if STEP.match(s)] == ["50", "100", "150"], lines
    finally:
        progress.on_train_end(trainer, module)


def test_a_new_training_in_the_same_process_prints_its_steps_again(lines):
    """A basic sweep runs its jobs in one process: job 2's step 1 is printed though job 1's last line was step 1."""
    for _ in range(2):
        trainer = SimpleNamespace(global_step=0, is_global_zero=True, estimated_stepping_batches=1, current_epoch=0,
                                  callback_metrics={}, sanity_checking=False)
        progress = ProgressLog(every_n_steps=50, heartbeat_s=30.0)
        module = SimpleNamespace(tokens_seen=0)
        progress.on_train_start(trainer, module)
        trainer.global_step = 1
        progress.on_train_batch_end(trainer, module, None, None, 0)
        progress.on_train_end(trainer, module)
    assert [STEP.match(s).group(1) for s in lines if STEP.match(s)] == ["1", "1"], lines
