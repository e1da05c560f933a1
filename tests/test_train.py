"""End-to-end `python -m mhalab.train` runs: each offline task, loggers, multirun, DDP, and early failures."""

import csv
import time
from pathlib import Path

import pytest
from conftest import summaries

from mhalab.stats import STAT_NAMES


def run_dir_of(summary) -> Path:
    return Path(summary["run_dir"])


def test_bbc_news_run_writes_summary_stats_plots_and_every_logger(run_train, tmp_path):
    r = run_train("logger=many")
    assert r.returncode == 0, r.stderr[-3000:]
    (s,) = summaries(tmp_path / "logs")
    run_dir = run_dir_of(s)
    assert r.stdout.strip().splitlines()[-1].startswith("mhalab: done in")  # the run ends saying where it all is
    assert f"results in {run_dir}/summary.json" in r.stdout
    assert s["status"] == "ok" and s["task"] == "bbc_news"
    for key in ("val/loss", "val/acc", "val/acc_best", "train/loss"):
        assert key in s["metrics"]
    assert {"test/loss", "test/acc"} <= set(s["test_metrics"])
    assert s["cost"]["params"] > 0 and s["cost"]["kv_cache_bytes_per_token"] == 2 * 2 * 16 * 4
    assert s["timings"]["train_steps"] == 3 and s["timings"]["tokens_per_s"] > 0
    assert sorted(s["head_stats"]) == ["L0H0", "L0H1"]
    assert set(s["head_stats"]["L0H0"]) == set(STAT_NAMES)
    assert sorted(s["head_importance"]) == ["L0H0", "L0H1"]
    assert (run_dir / "plots" / "attention_maps.png").stat().st_size > 0
    assert (run_dir / "plots" / "stat_entropy.png").exists() and (run_dir / "plots" / "stat_importance.png").exists()
    # CSV has the per-head scalars, TensorBoard its event file, wandb an offline run
    with open(run_dir / "csv" / "metrics.csv") as f:
        header = next(csv.reader(f))
    assert "attn/L0H1/entropy" in header and "attn/L0/entropy_mean" in header and "val/acc" in header
    assert list((run_dir / "tensorboard").rglob("events.out.tfevents.*"))
    offline = list((run_dir / "wandb").glob("offline-run-*"))
    assert offline and list(offline[0].glob("*.wandb"))
    # the pictures can be redrawn from summary.json and the checkpoint alone
    from mhalab.plots import main as plots_main

    assert plots_main([str(run_dir), "--out", str(tmp_path / "redrawn")]) == 0
    assert (tmp_path / "redrawn" / "attention_maps.png").stat().st_size > 0
    assert (tmp_path / "redrawn" / "stat_first_token.png").exists()


def test_bbc_news_mlm_run_reports_bits_per_byte(run_train, tmp_path):
    r = run_train("data=bbc_news_mlm")
    assert r.returncode == 0, r.stderr[-3000:]
    (s,) = summaries(tmp_path / "logs")
    assert s["objective"] == "mlm" and 0 < s["metrics"]["val/bpb"] < 20 and "test/bpb" in s["test_metrics"]


def test_listops_run_with_gqa_and_rotary(run_train, tmp_path):
    r = run_train("data=listops", "attention=gqa", "attention.n_heads=4", "model.pos=rotary",
                  "data.listops.n_train=256", "data.listops.n_val=32", "data.listops.n_test=32",
                  "data.listops.max_length=63", "data.listops.min_length=16")
    assert r.returncode == 0, r.stderr[-3000:]
    (s,) = summaries(tmp_path / "logs")
    assert s["task"] == "listops" and s["config"]["attention"]["n_kv_heads"] == 2
    assert sorted(s["kv_groups"]) == ["L0"] and s["kv_groups"]["L0"]["within_group_jsd"] is not None


def test_multirun_gives_one_directory_and_summary_per_job(run_train, tmp_path):
    r = run_train("attention.n_heads=1,2,4,8", "stats=off", multirun=True)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = summaries(tmp_path / "logs")
    assert sorted(s["config"]["attention"]["n_heads"] for s in runs) == [1, 2, 4, 8]
    assert len({s["run_dir"] for s in runs}) == 4


def test_ddp_on_two_cpu_processes(run_train, tmp_path):
    r = run_train("trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "stats=off")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "distributed_backend=gloo" in r.stdout + r.stderr
    (s,) = summaries(tmp_path / "logs")  # written once, by rank 0
    assert s["status"] == "ok"


@pytest.mark.parametrize("overrides,message", [
    (["attention.n_heads=8", "attention.n_kv_heads=3"],
     "attention.n_kv_heads=3 with attention.n_heads=8: n_kv_heads must divide n_heads"),
    (["model.d_model=0"], "model.d_model=0"),
    (["data.task=squad"], "data.task"),
])
def test_config_error_exits_2_with_one_sentence_and_no_run_dir(run_train, tmp_path, overrides, message):
    r = run_train(*overrides)
    assert r.returncode == 2, r.stderr[-2000:]
    assert message in r.stderr
    assert not list((tmp_path / "logs").rglob("*/runs/*"))  # nothing left that looks like a result


def test_hub_task_offline_fails_fast_with_alternatives(run_train, tmp_path):
    start = time.monotonic()
    r = run_train("data=ag_news", env={"HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2
    assert "ag_news" in r.stderr and "bbc_news" in r.stderr
    assert time.monotonic() - start < 60  # includes interpreter and torch start-up
    assert not list((tmp_path / "logs").rglob("*/runs/*"))


@pytest.mark.slow
def test_default_run_learns_the_topics(run_train, tmp_path):
    """The README's main job, unchanged (about 90 s on 2 cores): well above the 20% chance level."""
    r = run_train("logger=csv", "trainer.enable_progress_bar=false", tiny=False, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    (s,) = summaries(tmp_path / "logs")
    assert s["metrics"]["val/acc"] > 0.85 and s["test_metrics"]["test/acc"] > 0.85
