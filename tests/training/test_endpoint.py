"""Endpoints recorded by a real run: the validation history, the first step reaching endpoint.threshold, and the
opt-in stop there."""

import json
from pathlib import Path

from conftest import refusal


def _summary(root: Path) -> dict:
    (path,) = root.glob("logs/train/runs/*/summary.json")
    return json.loads(path.read_text())


def test_history_and_threshold_step_and_the_stop_at_it(train, tmp_path):
    r = train("trainer.val_check_interval=1", "trainer.limit_train_batches=3", "endpoint.threshold=0.0",
              "endpoint.stop_at_threshold=true", "seed=1")
    assert r.returncode == 0, r.stderr[-2000:]
    s = _summary(tmp_path)
    # val/acc >= 0 holds at the first validation (step 1): the run stops there instead of running 3 steps
    assert s["endpoint"]["threshold_step"] == 1 and s["endpoint"]["stopped_early"] is True
    assert s["timings"]["train_steps"] == 1
    assert s["history"]["step"] == [1] and len(s["history"]["val/acc"]) == 1
    assert s["history"]["val/acc"][-1] == s["metrics"]["val/acc"]


def test_a_threshold_never_reached_is_recorded_as_none_and_the_run_goes_on(train, tmp_path):
    r = train("trainer.val_check_interval=1", "trainer.limit_train_batches=3", "endpoint.threshold=1.5",
              "endpoint.stop_at_threshold=true")
    assert r.returncode == 0, r.stderr[-2000:]
    s = _summary(tmp_path)
    assert s["endpoint"]["threshold_step"] is None and s["endpoint"]["stopped_early"] is False
    assert s["history"]["step"] == [1, 2, 3] and s["timings"]["train_steps"] == 3
    # the summary keeps the run's last validation even when testing loaded an earlier (best) checkpoint
    assert s["metrics"]["val/acc"] == s["history"]["val/acc"][-1] and s["metrics"]["val/loss"] == \
        s["history"]["val/loss"][-1]


def test_bad_endpoint_values_are_one_sentence(train):
    for override, message in (("endpoint.stop_at_threshold=true", "needs endpoint.threshold"),
                              ("endpoint.metric=acc", "must be a validation metric"),
                              ("endpoint.threshold=inf", "endpoint.threshold=inf"),
                              ("endpoint.margin=0", "endpoint.margin=0")):
        r = train(override)
        assert message in refusal(r), (override, r.stderr[-500:])
