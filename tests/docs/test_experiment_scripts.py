"""Experiment scripts whose output a README records, noise_floor's and reanalysis's, still print that output on HEAD
(a script that crashes or drifts from its page is a figure nobody can rerun), and determinism's compare.py tells
identical runs from different ones; each writes into tmp_path, never into the tree."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.proc  # every test here starts a real script

REPO = Path(__file__).resolve().parents[2]


def run(script: str, *args: str) -> str:
    r = subprocess.run([sys.executable, str(REPO / script), *args], capture_output=True, text=True, cwd=REPO,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_noise_floor_prints_the_table_its_readme_copies(tmp_path):
    recorded = (REPO / "experiments" / "noise_floor" / "paired.md").read_text()
    assert run("experiments/noise_floor/paired.py", str(tmp_path / "paired.md")) == recorded
    assert (tmp_path / "paired.md").read_text() == recorded
    assert "| head_sweep (n_heads at d_model 64) | n_heads=1 - n_heads=2 |" in recorded


@pytest.mark.slow
def test_reanalysis_prints_its_readme(tmp_path):
    have = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", "a08120a^{commit}"], capture_output=True)
    if have.returncode:
        pytest.skip("this checkout lacks commit a08120a, whose report.csv files reanalyse.py reads (a shallow clone)")
    here = REPO / "experiments" / "reanalysis"
    assert run("experiments/reanalysis/reanalyse.py", str(tmp_path / "report.json")) == (here / "README.md").read_text()
    assert (tmp_path / "report.json").read_text() == (here / "results" / "report.json").read_text()


@pytest.mark.slow
def test_compare_tells_a_run_from_a_changed_copy_and_says_when_weights_are_not_compared(tiny_runs, tmp_path):
    import json
    import shutil

    a = tiny_runs[0]
    assert run("experiments/determinism/compare.py", str(a), str(a)).rstrip().endswith("\nbit-identical")
    b = tmp_path / "b"
    shutil.copytree(a, b)
    summary = json.loads((b / "summary.json").read_text())
    (b / summary["checkpoints"]["last"]).unlink()  # as a saved design run: no checkpoint
    assert run("experiments/determinism/compare.py", str(a), str(b)).rstrip().endswith(
        "weights: not compared (a run keeps no last.ckpt)\nbit-identical in metrics and head statistics")
    name = next(iter(summary["head_stats"]))
    summary["head_stats"][name][0][0] += 1e-7
    (b / "summary.json").write_text(json.dumps(summary))
    out = run("experiments/determinism/compare.py", str(a), str(b))
    assert "head statistics: 1 of " in out and out.rstrip().endswith("not identical")
