"""What a training step and a job no longer pay for changes nothing a user reads (issue 26): train/loss is handed to
Lightning only after the batches where something reads it, yet the loggers, the checkpoint callbacks and the
console get the values a call at every step gives; the hyperparameters are written once, with the same keys."""

import csv

import pytest
import yaml

from mhalab.runs.summary import read_summary

STEPS = ["trainer.max_epochs=3", "trainer.limit_train_batches=4", "trainer.val_check_interval=3",
         "checkpoint.monitor=train/loss", "checkpoint.mode=min", "callbacks.progress_log.every_n_steps=5"]


def _losses(run_dir) -> dict[int, str]:
    with open(run_dir / "csv" / "metrics.csv") as f:
        return {int(r["step"]): r["train/loss"] for r in csv.DictReader(f) if r.get("train/loss")}


def _run(train, root, every: int):
    r = train(*STEPS, f"trainer.log_every_n_steps={every}", root=root)
    assert r.returncode == 0, r.stderr[-3000:]
    (run_dir,) = (root / "logs" / "train" / "runs").iterdir()
    lines = [ln.split(" - ", 1)[1].split(" | ") for ln in r.stdout.splitlines() if "tokens/s" in ln]
    shown = {int(ln[0].split()[1].split("/")[0]): ln[2] for ln in lines}  # step -> "train/loss <value>"
    return run_dir, read_summary(run_dir), shown


@pytest.mark.slow
def test_train_loss_reaches_loggers_checkpoints_and_console_as_if_logged_every_step(train, tmp_path):
    dense_dir, dense, dense_lines = _run(train, tmp_path / "dense", every=1)
    sparse_dir, sparse, sparse_lines = _run(train, tmp_path / "sparse", every=5)
    every_step = _losses(dense_dir)
    assert sorted(every_step) == list(range(12))  # 3 epochs of 4 steps, each step written
    written = _losses(sparse_dir)
    assert sorted(written) == [4, 9]  # Lightning writes after steps 5 and 10 (its `step` counts from 0)
    assert written == {s: every_step[s] for s in written}  # the same value, to the last digit
    # the best checkpoint by train/loss (read at each validation end) and what testing it gives
    assert sparse.checkpoints == dense.checkpoints and sparse.test_metrics == dense.test_metrics
    assert sparse.metrics == dense.metrics and sparse.history == dense.history
    # the console's progress lines (the first step's, every 5 steps; heartbeats come with the machine's pace)
    assert {1, 5, 10} <= dense_lines.keys() & sparse_lines.keys()
    assert all(sparse_lines[s] == dense_lines[s] for s in dense_lines.keys() & sparse_lines.keys())
    assert dense_lines[5] != "train/loss -" and dense_lines[5] != dense_lines[10]


def test_hyperparameters_are_the_runs_config_then_the_modules(train, tmp_path):
    r = train()
    assert r.returncode == 0, r.stderr[-3000:]
    (run_dir,) = (tmp_path / "logs" / "train" / "runs").iterdir()
    hparams = yaml.safe_load((run_dir / "csv" / "hparams.yaml").read_text())
    assert list(hparams) == ["config", "architecture", "cost", "arch", "optim", "token_bytes", "endpoint"]
    assert hparams["arch"] == hparams["architecture"] == read_summary(run_dir).architecture
    assert hparams["optim"] == hparams["config"]["optim"]
