"""No result is destroyed (issue 24, "Trust boundaries"): a run directory (`hydra.run.dir`) or a sweep directory
(`hydra.sweep.dir`) that already holds a run is refused before anything is written, unless the command resumes it;
each vector a real `mhalab train` process, the finished results hashed before and after."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TINY, refusal

pytestmark = pytest.mark.proc  # every test here starts real processes

REPO = Path(__file__).resolve().parents[2]


def mhalab(root: Path, data_cache: Path, *overrides: str, multirun: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "SLURM_")) and k != "MHALAB_ALLOW"}
    env.update({"MHALAB_ROOT": str(root), "PYTHONPATH": str(REPO / "src"), "WANDB_SILENT": "true"})
    argv = [sys.executable, "-m", "mhalab", "train", *(["-m"] if multirun else []), *TINY,
            f"data.cache_dir={data_cache}", *overrides]
    return subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=300)


def hashes(folder: Path) -> dict[str, str]:
    """Every file under folder (the lock file aside: taking a lock writes the taker's pid) -> its sha256."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".lock"}


@pytest.fixture(scope="module")
def finished(tmp_path_factory, data_cache) -> tuple[Path, Path, Path]:
    """(root, a finished run directory, a finished sweep directory of two jobs), made once."""
    root = tmp_path_factory.mktemp("overwrite")
    r = mhalab(root, data_cache)
    assert r.returncode == 0, r.stderr[-3000:]
    r = mhalab(root, data_cache, "seed=0,1", multirun=True)
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = (root / "logs" / "train" / "runs").iterdir()
    (sweep,) = (root / "logs" / "train" / "multiruns").iterdir()
    assert json.loads((run / "summary.json").read_text())["status"] == "ok"
    return root, run, sweep


def refused(r: subprocess.CompletedProcess, key: str, folder: Path) -> None:
    line = refusal(r)
    assert line.startswith(f"error: {key}={folder} already holds a run")
    assert f"resume={folder}" in line and "choose a new directory" in line


def test_a_finished_run_is_not_overwritten(finished, data_cache):
    root, run, _ = finished
    before = hashes(run)
    assert {"summary.json", "checkpoints/last.ckpt", ".hydra/hydra.yaml", "train.log"} <= set(before)
    refused(mhalab(root, data_cache, f"hydra.run.dir={run}", "seed=5"), "hydra.run.dir", run)
    assert hashes(run) == before


def test_a_finished_sweep_is_not_overwritten(finished, data_cache):
    root, _, sweep = finished
    before = hashes(sweep)
    refused(mhalab(root, data_cache, f"hydra.sweep.dir={sweep}", "seed=0,1", multirun=True), "hydra.sweep.dir",
            sweep)
    assert hashes(sweep) == before


def test_a_sweep_job_folder_is_not_a_new_run_directory(finished, data_cache):
    root, _, sweep = finished
    before = hashes(sweep)
    refused(mhalab(root, data_cache, f"hydra.run.dir={sweep / '1'}"), "hydra.run.dir", sweep / "1")
    assert hashes(sweep) == before


@pytest.mark.parametrize("keep", [".hydra", "checkpoints"])
def test_an_unfinished_run_is_not_overwritten_either(finished, data_cache, tmp_path, keep):
    """A run that died before its summary (only Hydra's bookkeeping, or only its checkpoints) is resumed, never
    started again over."""
    root, run, _ = finished
    copy = tmp_path / "unfinished"
    copy.mkdir()
    shutil.copytree(run / keep, copy / keep)
    before = hashes(copy)
    refused(mhalab(root, data_cache, f"hydra.run.dir={copy}"), "hydra.run.dir", copy)
    assert hashes(copy) == before


def test_resuming_the_finished_run_changes_nothing(finished, data_cache):
    root, run, _ = finished
    before = hashes(run)
    r = mhalab(root, data_cache, f"resume={run}")
    assert r.returncode == 0 and "nothing to resume" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    assert hashes(run) == before


def test_an_existing_folder_without_a_run_may_be_the_run_directory(finished, data_cache, tmp_path):
    root, _, _ = finished
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("kept")
    r = mhalab(root, data_cache, f"hydra.run.dir={folder}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((folder / "summary.json").read_text())["status"] == "ok"
    assert (folder / "notes.txt").read_text() == "kept"
