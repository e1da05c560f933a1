"""mhalab.report: tables, failed jobs and plots from summary.json files; experiment configs compose."""

import csv
import json
import statistics
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from mhalab.report import CSV_COLUMNS, main, report
from mhalab.train import CONF_DIR

EXPERIMENTS = sorted(p.stem for p in Path(CONF_DIR, "experiment").glob("*.yaml"))


def fake_summary(n_heads, seed, bpb, tps=1000.0, objective="mlm"):
    return {
        "status": "ok", "task": "bbc_news_mlm", "objective": objective,
        "overrides": [f"attention.n_heads={n_heads}", f"seed={seed}", "experiment=head_sweep"],
        "config": {"seed": seed, "attention": {"n_heads": n_heads, "n_kv_heads": None, "d_head": None},
                   "model": {"d_model": 64, "n_layers": 2}},
        "metrics": {"val/bpb": bpb, "val/acc": 0.5, "val/loss": 2.0},
        "test_metrics": {"test/bpb": bpb + 0.1},
        "cost": {"params": 1000 * n_heads, "flops_per_token": 2e5, "attention_flops_per_token": 1e5,
                 "kv_cache_bytes_per_token": 1024},
        "timings": {"tokens_per_s": tps, "fit_s": 10.0, "train_steps": 100},
        "head_stats": {f"L0H{h}": {"entropy_norm": 0.5, "confidence": 0.2, "distance": 3.0, "prev": 0.1}
                       for h in range(n_heads)},
        "head_importance": {f"L0H{h}": float(h + 1) for h in range(n_heads)},
        "kv_groups": {},
    }


def write_sweep(root: Path) -> dict:
    values = {1: [3.0, 3.2, 3.1], 4: [2.5, 2.6, 2.9]}
    job = 0
    for n_heads, bpbs in values.items():
        for seed, bpb in enumerate(bpbs):
            d = root / str(job)
            d.mkdir(parents=True)
            (d / "summary.json").write_text(json.dumps(fake_summary(n_heads, seed, bpb, tps=1000.0 + seed)))
            job += 1
    d = root / str(job)
    d.mkdir()
    (d / "summary.json").write_text(json.dumps({"status": "failed", "kind": "config", "error": "n_kv_heads=3 bad",
                                                "overrides": ["attention.n_kv_heads=3", "seed=0"]}))
    d = root / str(job + 1) / ".hydra"  # a job killed before it wrote anything
    d.mkdir(parents=True)
    (d / "overrides.yaml").write_text("- attention.n_heads=16\n- seed=2\n")
    return values


def test_synthetic_sweep_mean_std_failed_csv_and_plots(tmp_path):
    values = write_sweep(tmp_path / "sweep")
    r = report([tmp_path / "sweep"])
    out = tmp_path / "sweep" / "report"
    assert [row["n_heads"] for row in r["rows"]] == [1, 4]
    for row in r["rows"]:
        assert row["metric"] == "val/bpb" and row["n_seeds"] == 3
        assert row["metric_mean"] == pytest.approx(statistics.fmean(values[row["n_heads"]]))
        assert row["metric_std"] == pytest.approx(statistics.stdev(values[row["n_heads"]]))
        assert row["d_head"] == 64 // row["n_heads"]
    assert r["swept"] == ["attention.n_heads"]
    deltas = [b - a for a, b in zip(values[1], values[4])]  # paired by seed against the first row
    assert r["rows"][1]["delta_mean"] == pytest.approx(statistics.fmean(deltas))
    assert r["rows"][1]["delta_std"] == pytest.approx(statistics.stdev(deltas))
    assert r["rows"][0]["delta_mean"] == 0 and r["rows"][1]["baseline"] == "attention.n_heads=1"
    assert len(r["failed"]) == 2
    md = (out / "report.md").read_text()
    assert "n_kv_heads=3 bad" in md and "no summary.json" in md and "Failed jobs (2)" in md
    assert f"{statistics.fmean(values[4]):.4f} ± {statistics.stdev(values[4]):.4f}" in md
    with (out / "report.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == CSV_COLUMNS and len(rows) == 2
    assert float(rows[1]["metric_mean"]) == pytest.approx(statistics.fmean(values[4]))
    assert (out / "metric_vs_n_heads.png").stat().st_size > 1000
    assert not (out / "metric_vs_n_kv_heads.png").exists()  # n_kv_heads only follows n_heads here
    # a second report into another folder does not read the first report's files as jobs
    r2 = report([tmp_path / "sweep"], out=tmp_path / "other")
    assert len(r2["rows"]) == 2


def test_kv_sweep_plot_and_cli(tmp_path, capsys):
    root = tmp_path / "kv"
    for i, (g, seed) in enumerate([(g, s) for g in (8, 4, 1) for s in (0, 1)]):
        s = fake_summary(8, seed, 3.0 - 0.1 * g + 0.01 * seed)
        s["overrides"] = [f"attention.n_kv_heads={g}", f"seed={seed}"]
        s["config"]["attention"]["n_kv_heads"] = g
        s["cost"]["kv_cache_bytes_per_token"] = 128 * g
        (root / str(i)).mkdir(parents=True)
        (root / str(i) / "summary.json").write_text(json.dumps(s))
    main([str(root), "--out", str(tmp_path / "rep")])
    assert "Failed jobs (0)" in capsys.readouterr().out
    assert (tmp_path / "rep" / "metric_vs_n_kv_heads.png").exists()
    with (tmp_path / "rep" / "report.csv").open() as f:
        assert [int(r["n_kv_heads"]) for r in csv.DictReader(f)] == [8, 4, 1]  # MHA -> GQA -> MQA


def test_missing_dir_is_a_config_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "nope")])
    assert e.value.code == 2 and "does not exist" in capsys.readouterr().err


def test_real_tiny_multirun_keeps_good_jobs_and_lists_the_failed_one(run_train, tmp_path):
    p = run_train("attention.n_heads=4", "attention.n_kv_heads=2,3,1", "stats.plots=false", multirun=True)
    assert p.returncode == 0, p.stderr[-2000:]
    sweep = next((tmp_path / "logs" / "train" / "multiruns").iterdir())
    r = report([sweep])
    assert [(row["n_kv_heads"], row["n_seeds"]) for row in r["rows"]] == [(2, 1), (1, 1)]  # good jobs kept
    assert r["rows"][0]["metric"] == "val/acc" and r["rows"][0]["metric_mean"] is not None
    assert len(r["failed"]) == 1 and "attention.n_kv_heads=3" in r["failed"][0]["overrides"]
    assert "must divide" in (sweep / "report" / "report.md").read_text()


@pytest.fixture
def hydra_env(monkeypatch, tmp_path):
    monkeypatch.setenv("MHALAB_ROOT", str(tmp_path))
    monkeypatch.setenv("MHALAB_RUN_ID", "test")


def composed(*overrides):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=True)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_configs_compose_validate_and_sweep(name, hydra_env):
    from mhalab.config import validate

    assert {"head_sweep", "kv_sweep", "head_dim_sweep"} <= {e.split("_listops")[0].split("_gpu")[0]
                                                            for e in EXPERIMENTS}
    cfg = composed(f"experiment={name}")
    params = OmegaConf.to_container(cfg.hydra.sweeper.params)
    assert params["seed"] == "0,1,2"
    assert cfg.task_name == name
    swept = [k for k in params if k != "seed"]
    assert len(swept) == 1
    values = str(params[swept[0]]).split(",")
    for value in (values[0], values[-1]):  # the extreme points of the sweep are valid configs
        job = composed(f"experiment={name}", f"{swept[0]}={value}", "seed=1")
        validate(job)
        if name.startswith("head_sweep"):
            assert job.attention.n_kv_heads is None and job.attention.d_head is None
    assert ("gpu" in name) == (cfg.trainer.accelerator == "gpu")
    text = Path(CONF_DIR, "experiment", f"{name}.yaml").read_text()
    assert text.startswith("# @package _global_") and f"experiment={name}" in text


def test_kv_and_head_sweep_grids(hydra_env):
    assert composed("experiment=head_sweep").hydra.sweeper.params["attention.n_heads"] == "1,2,4,8,16"
    kv = composed("experiment=kv_sweep")
    assert kv.hydra.sweeper.params["attention.n_kv_heads"] == "8,4,2,1" and kv.attention.n_heads == 8


@pytest.mark.parametrize("launcher", ["parallel", "slurm"])
def test_launchers_and_optuna_sweeper_compose(launcher, hydra_env):
    cfg = composed("experiment=kv_sweep", f"hydra/launcher={launcher}")
    target = cfg.hydra.launcher._target_
    assert ("joblib" in target.lower()) if launcher == "parallel" else ("submitit" in target.lower())
    if launcher == "slurm":
        assert cfg.hydra.launcher.timeout_min > 0 and "submitit" in cfg.hydra.launcher.submitit_folder
    cfg = composed("hydra/sweeper=search")
    assert "optuna" in cfg.hydra.sweeper._target_.lower() and cfg.hydra.sweeper.direction == "minimize"


def test_wandb_offline_groups_the_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    write_sweep(tmp_path / "sweep")
    r = report([tmp_path / "sweep"], out=tmp_path / "rep", use_wandb=True)
    runs = sorted((tmp_path / "rep" / "wandb").glob("offline-run-*"))
    assert len(r["wandb_dirs"]) == 3 and len(runs) == 3  # one per configuration + the table run
