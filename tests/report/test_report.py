"""mhalab report: arms from runs, each at its best tuned value, exact tests against a baseline with Holm's
correction, rates and steps to a threshold, per-seed columns, failed and untrustworthy runs listed, escaped output."""

import csv
import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats

from mhalab.errors import ConfigError
from mhalab.cli import main
from mhalab.report.command import md_escape, report
from mhalab.runs.summary import RunSummary, write_summary


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


def test_exact_test_interval_and_verdict_against_the_named_baseline(tmp_path):
    """MHA and MQA differ in shapes, so the comparison is unpaired: the exact permutation test (checked against
    scipy), its interval inside the reachable range, Holm over the report's p-values."""
    write_sweep(tmp_path / "sweep")
    r = report([tmp_path / "sweep"], baseline="attention.n_kv_heads=8")
    (c,) = r["comparisons"]
    test_acc = {g: [a - 0.01 for a in accs] for g, accs in ACC.items()}
    ref = scipy_stats.permutation_test((np.array(test_acc[1]), np.array(test_acc[8])),
                                       lambda x, y: abs(np.mean(x) - np.mean(y)), permutation_type="independent",
                                       n_resamples=np.inf, alternative="greater").pvalue
    assert c["endpoint"] == "final test/acc" and c["test"].startswith("exact permutation test; unpaired")
    assert c["estimate"] == pytest.approx(statistics.fmean(test_acc[1]) - statistics.fmean(test_acc[8]))
    assert c["p"] == pytest.approx(ref) and c["p_holm"] == pytest.approx(ref)  # one comparison
    assert c["p_min"] == pytest.approx(2 / 252) and c["verdict"] == "separated"
    assert min(test_acc[1]) - max(test_acc[8]) <= c["ci95_low"] < c["estimate"] < c["ci95_high"] < 0
    with (tmp_path / "sweep" / "report" / "report.csv").open() as f:
        table = list(csv.DictReader(f))
    assert {"arm", "cell", "mean", "seed_0", "seed_4", "params", "batch_size", "passes"} <= set(table[0])
    assert [float(row["seed_2"]) for row in table] == [ACC[g][2] for g in (8, 1)]  # MHA -> MQA, per seed
    md = (tmp_path / "sweep" / "report" / "report.md").read_text()
    assert "separated" in md and "Failed jobs (2)" in md and "n_kv_heads=3 bad" in md and "no summary.json" in md
    assert "chance_acc 0.0312" in md and "## Design (read from the runs)" in md
    page = (tmp_path / "sweep" / "report" / "report.html").read_text()
    assert "<table>" in page and "data:image/png;base64," in page
    assert (tmp_path / "sweep" / "report" / "final.png").stat().st_size > 1000
    assert json.loads((tmp_path / "sweep" / "report" / "report.json").read_text())["comparisons"][0]["p"] == c["p"]


def test_an_effect_inside_the_noise_is_not_separated(tmp_path):
    for job, (g, seed, acc) in enumerate([(8, 0, 0.9), (8, 1, 0.8), (8, 2, 0.85), (8, 3, 0.88), (8, 4, 0.82),
                                          (4, 0, 0.85), (4, 1, 0.86), (4, 2, 0.83), (4, 3, 0.81), (4, 4, 0.87)]):
        write_summary(_mk(tmp_path / str(job)), run(g, seed, acc))
    (c,) = report([tmp_path], baseline="attention.n_kv_heads=8")["comparisons"]
    assert c["verdict"].startswith("not separa") and c["ci95_low"] < 0 < c["ci95_high"]


def threshold_run(g: int, seed: int, lr: float, step: int | None, acc: float, budget: int = 2000) -> RunSummary:
    s = run(g, seed, acc)
    s.overrides = [f"attention.n_kv_heads={g}", f"seed={seed}", f"optim.lr={lr}", "experiment=kv_sweep"]
    s.endpoint = {"metric": "val/acc", "threshold": 0.9, "stop_at_threshold": True, "tuned": ["optim.lr"],
                  "threshold_step": step}
    s.timings = {**s.timings, "train_steps": step or budget}
    s.history = {"step": [500, step or budget], "val/acc": [0.25, acc]}
    return s


def test_each_arm_at_its_best_learning_rate_with_rates_and_steps_to_threshold(tmp_path):
    """MHA reaches 0.9 at lr 1e-3 on 5/5 seeds, MQA only at lr 1e-2 (on 4/5): each arm is reported at its own best
    rate; the rates are compared with Barnard's exact test and the steps with the log-rank test."""
    job = 0
    plan = {(8, 1e-3): [800, 900, 1000, 700, 900], (8, 1e-2): [None] * 5,
            (1, 1e-3): [None] * 5, (1, 1e-2): [1200, None, 1400, 1600, 1800]}
    for (g, lr), steps in plan.items():
        for seed, step in enumerate(steps):
            write_summary(_mk(tmp_path / str(job)), threshold_run(g, seed, lr, step, 0.95 if step else 0.25))
            job += 1
    r = report([tmp_path], baseline="attention.n_kv_heads=8")
    chosen = {a.label: a.chosen.label for a in r["arms"]}
    assert chosen == {"attention.n_kv_heads=8": "optim.lr=0.001", "attention.n_kv_heads=1": "optim.lr=0.01"}
    by = {c["endpoint"].split(" ")[0]: c for c in r["comparisons"]}
    assert by["rate"]["arm_value"] == "4/5" and by["rate"]["baseline_value"] == "5/5"
    assert by["rate"]["p"] == pytest.approx(scipy_stats.barnard_exact([[4, 5], [1, 0]], n=200).pvalue, abs=1e-4)
    assert by["steps"]["test"].startswith("log-rank, exact") and by["steps"]["p"] < 0.05
    assert by["steps"]["arm_value"].startswith("1600") and by["steps"]["baseline_value"].startswith("900")
    holm = sorted(c["p_holm"] for c in r["comparisons"])
    assert holm[0] == pytest.approx(min(1.0, 3 * min(c["p"] for c in r["comparisons"])))
    md = r["markdown"]
    assert "Each arm at each tuned value" in md and "**optim.lr=0.01**" in md
    assert {p.name for p in r["plots"]} >= {"tuning.png", "reached.png", "curves.png", "final.png"}


def test_runs_in_different_metrics_are_refused_not_mixed(tmp_path):
    write_summary(_mk(tmp_path / "0"), run(8, 0, 0.9))
    lm = run(8, 1, 0.9)
    lm.metrics = {"val/bpb": 5.38, "val/loss": 3.0}
    write_summary(_mk(tmp_path / "1"), lm)
    with pytest.raises(ConfigError, match="different metrics.*val/acc: 1 runs.*val/bpb: 1 runs"):
        report([tmp_path])


def test_a_nan_metric_is_a_failed_job_not_a_traceback(tmp_path):
    write_sweep(tmp_path)
    bad = run(8, 5, float("nan"))
    bad.test_metrics = {"test/acc": float("nan")}
    write_summary(_mk(tmp_path / "nan"), bad)  # written as null (JSON has no NaN)
    r = report([tmp_path], baseline="attention.n_kv_heads=8")
    (c,) = r["comparisons"]
    assert c["verdict"] == "separated" and "seed_5" not in (tmp_path / "report" / "report.csv").read_text()
    assert [Path(f["dir"]).name for f in r["failed"] if f["kind"] == "non-finite"] == ["nan"]  # more in
    # tests/report/test_report_read_back.py


def test_identical_arms_are_said_in_words(tmp_path):
    for job, (g, seed) in enumerate([(8, 0), (8, 1), (4, 0), (4, 1)]):
        write_summary(_mk(tmp_path / str(job)), run(g, seed, 0.5))
    (c,) = report([tmp_path], baseline="attention.n_kv_heads=8")["comparisons"]
    assert "no spread, no test" in c["verdict"] and c["p"] is None


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
    assert len(unreadable) == 5 and len(r["arms"]) == 2


def test_markdown_from_run_files_is_escaped(tmp_path):
    s = run(8, 0, 0.9)
    s.overrides = ["attention.n_kv_heads=8", "seed=0", "tags=[<script>|x]"]
    write_summary(_mk(tmp_path / "0"), s)
    write_summary(_mk(tmp_path / "1"), RunSummary(status="failed", overrides=["a=<img src=x>"],
                                                   error={"kind": "config", "message": "|**boom**|\nnew line"}))
    md = report([tmp_path])["markdown"]
    assert "<script>" not in md and "<img" not in md and "**boom**" not in md
    assert md_escape("a|b<c>") == "a\\|b&lt;c&gt;"


def test_a_link_cell_escapes_its_text_and_links_relative_to_where_the_table_is_read(tmp_path):
    from mhalab.tables import Link, Table

    (tmp_path / "a b").mkdir()
    t = Table(["design", "x"])
    t.add([Link("a|*b*", tmp_path / "a b", tmp_path), "[1, 2]"])
    t.add([Link("<s>", tmp_path / "a b" / "stability.md", tmp_path / "a b"), "-"])
    md = t.markdown().splitlines()
    assert md[2] == "| [a\\|\\*b\\*](a%20b/) | \\[1, 2\\] |"  # a folder's link ends in /; other cells escaped
    assert md[3] == "| [&lt;s&gt;](stability.md) | - |"
    assert "<td><a href='a%20b/'>a|*b*</a></td>" in t.html() and "<s>" not in t.html()


def test_missing_dir_is_one_sentence_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["report", str(tmp_path / "nope")])
    assert e.value.code == 2 and "is not a directory" in capsys.readouterr().err


@pytest.mark.slow
def test_real_tiny_multirun_keeps_good_jobs_and_lists_the_failed_one(train, tmp_path):
    r = train("attention.n_heads=4", "attention.n_kv_heads=2,1", "stats.plots=false", "seed=0,1", multirun=True)
    assert r.returncode == 0, r.stderr[-2000:]
    sweep = next((tmp_path / "logs" / "train" / "multiruns").iterdir())
    rep = report([sweep], baseline="attention.n_kv_heads=2")
    assert [(a.design["n_kv_heads"], len(a.chosen.runs)) for a in rep["arms"]] == [(2, 2), (1, 2)]
    assert rep["comparisons"][0]["verdict"]  # 2 vs 2 runs: "not separable: this design's smallest p is 0.33"
    assert rep["metric"] == "val/acc" and rep["arms"][0].chosen.runs[0].summary.baselines["chance_acc"] == 0.2


def test_wandb_offline_groups_the_runs(tmp_path):
    write_sweep(tmp_path / "sweep")
    r = report([tmp_path / "sweep"], out=tmp_path / "rep", use_wandb=True)
    assert len(r["wandb_dirs"]) == 3 and len(list((tmp_path / "rep" / "wandb").glob("offline-run-*"))) == 3
