"""mhalab report: configurations from runs, paired confidence intervals against a baseline, verdicts, per-seed
columns, reference levels on the plots, failed and untrustworthy runs listed, escaped Markdown."""

import csv
import json
import math
import statistics
from pathlib import Path

import pytest
from scipy import stats as scipy_stats

from mhalab.errors import ConfigError
from mhalab.report import main, md_escape, report
from mhalab.summary import RunSummary, write_summary


def run(n_kv_heads: int, seed: int, acc: float, n_heads: int = 8, d_ff: int = 256, **extra) -> RunSummary:
    return RunSummary(
        status="ok", task="mqar", objective="clm",
        overrides=[f"attention.n_kv_heads={n_kv_heads}", f"seed={seed}", "experiment=kv_sweep"],
        config={"seed": seed},
        architecture={"vocab_size": 69, "objective": "clm", "n_classes": None,
                      "model": {"d_model": 64, "d_ff": d_ff, "n_layers": 2},
                      "attention": {"n_heads": n_heads, "n_kv_heads": n_kv_heads, "d_head": 8}},
        metrics={"val/acc": acc, "val/loss": 1.0}, test_metrics={"test/acc": acc - 0.01},
        cost={"params": 1000 + d_ff, "flops_per_token": 2e5, "attention_flops_per_token": 1e5,
              "kv_cache_bytes_per_token": 64 * n_kv_heads},
        baselines={"chance_acc": 1 / 32, "majority_acc": 0.04},
        timings={"tokens_per_s": 1000.0, "fit_s": 10.0, "train_steps": 100}, **extra)


ACC = {8: [0.90, 0.95, 0.85, 0.92, 0.88], 1: [0.60, 0.70, 0.55, 0.66, 0.62]}


def write_sweep(root: Path) -> None:
    job = 0
    for g, accs in ACC.items():
        for seed, acc in enumerate(accs):
            write_summary(_mk(root / str(job)), run(g, seed, acc))
            job += 1
    write_summary(_mk(root / str(job)), RunSummary(status="failed", overrides=["attention.n_kv_heads=3", "seed=0"],
                                                   error={"kind": "config", "message": "n_kv_heads=3 bad"}))
    _mk(root / str(job + 1) / ".hydra")  # a job killed before it wrote anything
    (root / str(job + 1) / ".hydra" / "overrides.yaml").write_text("- attention.n_kv_heads=2\n- seed=2\n")


def _mk(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def test_paired_difference_ci_p_mde_and_verdict_against_the_named_baseline(tmp_path):
    write_sweep(tmp_path / "sweep")
    r = report([tmp_path / "sweep"], baseline="attention.n_kv_heads=8")
    rows = {row["n_kv_heads"]: row for row in r["rows"]}
    diffs = [a - b for a, b in zip(ACC[1], ACC[8])]
    n, mean, sd = len(diffs), statistics.fmean(diffs), statistics.stdev(diffs)
    t975 = scipy_stats.t.ppf(0.975, n - 1)
    mqa = rows[1]
    assert mqa["diff"] == pytest.approx(mean) and mqa["n_paired"] == 5
    assert mqa["ci95_low"] == pytest.approx(mean - t975 * sd / math.sqrt(n))
    assert mqa["ci95_high"] == pytest.approx(mean + t975 * sd / math.sqrt(n))
    assert mqa["p"] == pytest.approx(scipy_stats.ttest_rel(ACC[1], ACC[8]).pvalue)
    assert mqa["mde80"] == pytest.approx((t975 + scipy_stats.t.ppf(0.8, n - 1)) * sd / math.sqrt(n))
    assert mqa["verdict"] == "separated" and rows[8]["baseline"] == "attention.n_kv_heads=8"
    assert rows[8]["mean"] == pytest.approx(statistics.fmean(ACC[8]))
    assert rows[8]["mean_ci95_low"] < rows[8]["mean"] < rows[8]["mean_ci95_high"]
    assert rows[1]["params"] == 1256 and rows[1]["d_ff"] == 256 and rows[1]["kv_cache_bytes_per_token"] == 64
    with (tmp_path / "sweep" / "report" / "report.csv").open() as f:
        table = list(csv.DictReader(f))
    assert {"ci95_low", "ci95_high", "p", "mde80", "verdict", "seed_0", "seed_4"} <= set(table[0])
    assert [float(row["seed_2"]) for row in table] == [ACC[g][2] for g in (8, 1)]  # MHA -> MQA, per seed
    md = (tmp_path / "sweep" / "report" / "report.md").read_text()
    assert "separated" in md and "Failed jobs (2)" in md and "n_kv_heads=3 bad" in md and "no summary.json" in md
    assert "chance_acc 0.0312" in md
    assert (tmp_path / "sweep" / "report" / "metric_vs_n_kv_heads.png").stat().st_size > 1000


def test_an_effect_inside_the_noise_is_not_separated(tmp_path):
    for job, (g, seed, acc) in enumerate([(8, 0, 0.9), (8, 1, 0.8), (8, 2, 0.85), (4, 0, 0.85), (4, 1, 0.86),
                                          (4, 2, 0.83)]):
        write_summary(_mk(tmp_path / str(job)), run(g, seed, acc))
    rows = {r["n_kv_heads"]: r for r in report([tmp_path], baseline="attention.n_kv_heads=8")["rows"]}
    assert rows[4]["verdict"] == "not separated" and rows[4]["ci95_low"] < 0 < rows[4]["ci95_high"]
    assert rows[4]["mde80"] > abs(rows[4]["diff"])


def test_an_unknown_baseline_lists_the_configurations(tmp_path):
    write_sweep(tmp_path)
    with pytest.raises(ConfigError, match="attention.n_kv_heads=8; attention.n_kv_heads=1"):
        report([tmp_path], baseline="attention.n_kv_heads=2")


def test_untrustworthy_files_are_listed_as_failed_never_read_as_results(tmp_path):
    write_sweep(tmp_path)
    bad = {"recursion.json": "[" * 100000 + "]" * 100000, "not_utf8.json": b"\xff\xfe{",
           "foreign.json": json.dumps({"status": "ok", "metrics": "lots"}),
           "old.json": json.dumps({"status": "ok", "schema_version": 0})}
    for i, (name, content) in enumerate(bad.items()):
        d = _mk(tmp_path / f"bad{i}")
        (d / "summary.json").write_bytes(content if isinstance(content, bytes) else content.encode())
    link = _mk(tmp_path / "link")
    (link / "summary.json").symlink_to("/dev/zero")
    r = report([tmp_path])
    unreadable = [f for f in r["failed"] if f["kind"] == "unreadable"]
    assert len(unreadable) == 5 and len(r["rows"]) == 2


def test_markdown_from_run_files_is_escaped(tmp_path):
    s = run(8, 0, 0.9)
    s.overrides = ["attention.n_kv_heads=8", "seed=0", "tags=[<script>|x]"]
    write_summary(_mk(tmp_path / "0"), s)
    write_summary(_mk(tmp_path / "1"), RunSummary(status="failed", overrides=["a=<img src=x>"],
                                                   error={"kind": "config", "message": "|**boom**|\nnew line"}))
    md = report([tmp_path])["markdown"]
    assert "<script>" not in md and "<img" not in md and "**boom**" not in md
    assert md_escape("a|b<c>") == "a\\|b&lt;c&gt;"


def test_missing_dir_is_one_sentence_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "nope")])
    assert e.value.code == 2 and "is not a directory" in capsys.readouterr().err


def test_real_tiny_multirun_keeps_good_jobs_and_lists_the_failed_one(train, tmp_path):
    r = train("attention.n_heads=4", "attention.n_kv_heads=2,1", "stats.plots=false", "seed=0,1", multirun=True)
    assert r.returncode == 0, r.stderr[-2000:]
    sweep = next((tmp_path / "logs" / "train" / "multiruns").iterdir())
    rep = report([sweep], baseline="attention.n_kv_heads=2")
    assert [(row["n_kv_heads"], row["n_seeds"]) for row in rep["rows"]] == [(2, 2), (1, 2)]
    assert rep["rows"][1]["verdict"] in ("separated", "not separated")
    assert rep["rows"][0]["metric"] == "val/acc" and rep["rows"][0]["baselines"]["chance_acc"] == 0.2


def test_wandb_offline_groups_the_runs(tmp_path):
    write_sweep(tmp_path / "sweep")
    r = report([tmp_path / "sweep"], out=tmp_path / "rep", use_wandb=True)
    assert len(r["wandb_dirs"]) == 3 and len(list((tmp_path / "rep" / "wandb").glob("offline-run-*"))) == 3
