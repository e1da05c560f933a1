"""`mhalab report` on summaries it did not write (issue 24): a run with status ok but a NaN or infinite metric is a
failed job with its reason, report.json is strict JSON, and `--baseline key=value` works as `--baseline=key=value`."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mhalab.options import parse
from mhalab.errors import ConfigError
from mhalab.report.command import report, report_command
from mhalab.report.options import ReportOptions
from mhalab.runs.summary import RunSummary, read_summary, write_summary

RUNS = [(0.1, 0, 0.5), (0.1, 1, 0.6), (0.2, 0, 0.7), (0.2, 1, 0.8)]  # (optim.lr, seed, accuracy)


def _strict(text: str):
    """json.loads that refuses NaN and Infinity, which are not JSON."""
    def refuse(constant):
        raise ValueError(f"bare {constant} in JSON")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def sweep(tmp_path) -> Path:
    """Four finished runs, two arms (optim.lr) x two seeds, and two more with status ok but a non-finite metric:
    one as mhalab writes it (null), one with a bare NaN written by hand."""
    runs = RUNS + [(0.2, 2, 0.9), (0.2, 3, 0.9)]
    for i, (lr, seed, acc) in enumerate(runs):
        d = tmp_path / str(i)
        d.mkdir()
        write_summary(d, RunSummary(status="ok", task="bbc_news", objective="classification",
                                    overrides=[f"optim.lr={lr}", f"seed={seed}"], config={"seed": seed},
                                    metrics={"val/acc": acc, "val/loss": float("inf") if i == 4 else 1.0},
                                    test_metrics={"test/acc": acc}))
    nan = tmp_path / "5" / "summary.json"
    nan.write_text(nan.read_text().replace('"test/acc": 0.9', '"test/acc": NaN'))
    return tmp_path


def test_a_non_finite_metric_is_a_failed_job(sweep):
    assert read_summary(sweep / "5").test_metrics["test/acc"] is None  # a bare NaN is read as null
    r = report([sweep], plots=False)
    failed = {Path(f["dir"]).name: f for f in r["failed"]}
    assert set(failed) == {"4", "5"}
    assert failed["4"]["kind"] == "non-finite" and "val/loss" in failed["4"]["error"]
    assert failed["5"]["kind"] == "non-finite" and "test/acc" in failed["5"]["error"]
    assert sorted(len(a.chosen.runs) for a in r["arms"]) == [2, 2]  # the failed runs are in no arm
    assert "## Failed jobs (2)" in r["markdown"] and "NaN or infinite: test/acc" in r["markdown"]


def test_report_json_is_strict_json(sweep):
    r = report([sweep], plots=False)
    data = _strict((r["out"] / "report.json").read_text())  # two seeds: the interval is infinite, written null
    assert [c["ci95_low"] for c in data["comparisons"] if c["endpoint"].startswith("final")] == [None]
    assert len(_strict((r["out"] / "failed.json").read_text())) == 2


@pytest.mark.parametrize("argv", [["--baseline", "optim.lr=0.2"], ["--baseline=optim.lr=0.2"],
                                  ["baseline=optim.lr=0.2"]])
def test_baseline_with_an_equals_sign(argv):
    assert parse(ReportOptions, ["d", *argv]).baseline == "optim.lr=0.2"
    assert parse(ReportOptions, ["d", "--baseline", "seed=0", "metric=val/acc"]).metric == "val/acc"


@pytest.mark.proc
def test_baseline_forms_as_a_real_command(sweep, tmp_path):
    for i, form in enumerate((["--baseline", "optim.lr=0.2"], ["--baseline=optim.lr=0.2"])):
        out = tmp_path / f"out{i}"
        r = subprocess.run([sys.executable, "-P", "-m", "mhalab", "report", str(sweep), *form, "--no-plots",
                            "--out", str(out)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        comparisons = _strict((out / "report.json").read_text())["comparisons"]
        assert {c["baseline"] for c in comparisons} == {"optim.lr=0.2"}
        assert {c["arm"] for c in comparisons} == {"optim.lr=0.1"}


def test_same_arm_keys_make_no_arm_of_their_own(sweep):
    """A design's second numerics (trainer.precision) joins the runs of its arm under --same-arm; without it, an
    arm of its own (a user who sweeps the precision compares precisions)."""
    d = sweep / "6"
    d.mkdir()
    write_summary(d, RunSummary(status="ok", task="bbc_news", objective="classification",
                                overrides=["optim.lr=0.1", "seed=9", "trainer.precision=bf16-mixed"],
                                config={"seed": 9, "trainer": {"precision": "bf16-mixed"}},
                                metrics={"val/acc": 0.8, "val/loss": 1.0},
                                test_metrics={"test/acc": 0.8}))
    assert len(report([sweep], plots=False)["arms"]) == 3
    assert parse(ReportOptions, ["d", "--same-arm", "trainer.precision"]).same_arm == ["trainer.precision"]
    arms = report([sweep], plots=False, same_arm=("trainer.precision",))["arms"]
    runs = {a.label: sum(len(c.runs) for c in a.cells.values()) for a in arms}
    assert runs == {"optim.lr=0.1": 3, "optim.lr=0.2": 2}

    with pytest.raises(ConfigError, match="--same-arm trainer.nonexistent: not a key of these runs' configs"):
        report([sweep], plots=False, same_arm=("trainer.nonexistent",))

    # a stage run again on another kind of device (run_design --set-aside: stage A with trainer=gpu, stage B on a
    # CPU) is the same arm too under --same-arm trainer, as scripts/run_design.py reports its designs
    d = sweep / "7"
    d.mkdir()
    write_summary(d, RunSummary(status="ok", task="bbc_news", objective="classification",
                                overrides=["optim.lr=0.1", "seed=10", "trainer=gpu"],
                                config={"seed": 10, "trainer": {"accelerator": "gpu", "precision": "32-true"}},
                                metrics={"val/acc": 0.8, "val/loss": 1.0}, test_metrics={"test/acc": 0.8}))
    given = parse(ReportOptions, ["d", "--same-arm", "trainer,trainer.precision"]).same_arm
    assert given == ["trainer", "trainer.precision"]
    arms = report([sweep], plots=False, same_arm=tuple(given))["arms"]
    assert {a.label: sum(len(c.runs) for c in a.cells.values()) for a in arms} == {"optim.lr=0.1": 4,
                                                                                    "optim.lr=0.2": 2}


def test_numerics_refuses_what_it_would_ignore_and_a_report_given_twice(sweep, tmp_path):
    r = report([sweep], plots=False)
    path = str(r["out"] / "report.json")
    for extra in (["--same-arm", "trainer.precision"], ["--metric", "val/acc"]):
        with pytest.raises(ConfigError, match="--numerics compares finished reports: --"):
            report_command(parse(ReportOptions, ["--numerics", f"a:{path}", f"b:{path}", *extra]))
    with pytest.raises(ConfigError, match="one report is given twice"):
        report_command(parse(ReportOptions, ["--numerics", f"a:{path}", f"b:{path}"]))
    with pytest.raises(ConfigError, match="same name \\(report, report\\): name each as NAME:path"):
        report_command(parse(ReportOptions, ["--numerics", path, str(tmp_path / "report" / "report.json")]))


def test_a_seed_twice_in_one_cell_is_named(sweep):
    d = sweep / "7"
    d.mkdir()
    write_summary(d, RunSummary(status="ok", task="bbc_news", objective="classification",
                                overrides=["optim.lr=0.1", "seed=1"], config={"seed": 1},
                                metrics={"val/acc": 0.6, "val/loss": 1.0}, test_metrics={"test/acc": 0.6}))
    with pytest.raises(ConfigError, match="arm optim.lr=0.1 at - has two runs of seed 1: report one sweep"):
        report([sweep], plots=False)
