"""The grid sweeper (`hydra/sweeper=grid`, mhalab's default; `mhalab.runs.sweeper`) composes each job of a sweep
once, and its jobs end exactly as under Hydra's basic sweeper (issue 26). Tried on real `mhalab train -m` processes:
the compositions are counted by cProfile in the sweep's own process; the results are compared file by file."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import TINY, compositions, proc_env, slow_except

MHALAB = [sys.executable, "-m", "mhalab"]



def _sweep(root: Path, data_cache, *extra: str, profile: Path | None = None) -> Path:
    """A 3-job sweep of tiny runs under `root`; returns its sweep directory."""
    root.mkdir(parents=True, exist_ok=True)
    prefix = [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "mhalab"] if profile else MHALAB
    args = ["train", "-m", *TINY, f"paths.root_dir={root}", f"data.cache_dir={data_cache}", "seed=0,1,2",
            *extra]
    r = subprocess.run([*prefix, *args], cwd=root, env=proc_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (sweep,) = (root / "logs" / "train" / "multiruns").iterdir()
    return sweep



@pytest.mark.proc
@pytest.mark.slow  # a cost property; the default suite keeps the grid sweep against Hydra's basic sweeper
@pytest.mark.parametrize("sweeper, per_job", [("grid", 0), ("basic", 2)])
def test_a_grid_sweep_composes_each_job_once(tmp_path, data_cache, sweeper, per_job):
    """mhalab's preflight composes the master config and, once, the config its 3 jobs share but for their seeds
    (each job is a copy with its seed: `Composer.job_config`); Hydra composes the master twice (to read its mode,
    then to run); the grid sweeper takes each job's config from the preflight, where Hydra's basic sweeper composes
    it twice more (to check the batch, then in the launcher)."""
    prof = tmp_path / "sweep.prof"
    sweep = _sweep(tmp_path / "root", data_cache, "hydra/launcher=basic", f"hydra/sweeper={sweeper}", profile=prof)
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1", "2"]
    assert compositions(prof) == 4 + 3 * per_job


def _job_files(sweep: Path) -> dict[str, object]:
    """What each job of a sweep wrote that must not depend on the sweeper: its metrics (CSV and summary), its
    overrides and its composed config; Hydra's config without the sweeper's own node and the sweep's folder."""
    files: dict[str, object] = {"multirun": _without_sweeper(yaml.safe_load((sweep / "multirun.yaml").read_text()),
                                                             sweep)}
    for job in sorted(p for p in sweep.iterdir() if p.is_dir()):
        summary = json.loads((job / "summary.json").read_text())
        kept = {k: summary[k] for k in ("status", "metrics", "test_metrics", "history", "head_stats", "overrides",
                                        "config")}
        files[f"{job.name}/summary"] = json.loads(_anonymous(json.dumps(kept), sweep))
        (csv,) = job.glob("csv/**/metrics.csv")
        files[f"{job.name}/metrics.csv"] = csv.read_bytes()
        for name in ("config.yaml", "overrides.yaml"):
            files[f"{job.name}/{name}"] = _anonymous((job / ".hydra" / name).read_text(), sweep)
        files[f"{job.name}/hydra.yaml"] = _without_sweeper(yaml.safe_load((job / ".hydra" / "hydra.yaml").read_text()),
                                                           sweep)
    return files


def _without_sweeper(cfg: dict, sweep: Path) -> dict:
    hydra = cfg["hydra"]
    hydra.pop("sweeper")
    hydra["runtime"]["choices"].pop("hydra/sweeper")
    hydra["overrides"]["hydra"] = [o for o in hydra["overrides"]["hydra"] if not o.startswith("hydra/sweeper=")]
    return json.loads(_anonymous(json.dumps(cfg), sweep))


def _anonymous(text: str, sweep: Path) -> str:
    """The text without the folders that differ between the two sweeps: the sweep's, then the root's."""
    return text.replace(str(sweep), "<sweep>").replace(str(sweep.parents[3]), "<root>")


@pytest.mark.proc
@pytest.mark.parametrize("launcher", slow_except(["basic", "parallel"], keep={"basic"}))
def test_a_grid_sweep_ends_as_under_hydras_basic_sweeper(tmp_path, data_cache, launcher):
    """The same jobs in the same order and batches (`max_batch_size=2`: two batches), each with the same config,
    Hydra config, metrics.csv (byte for byte) and summary figures, on the basic and the joblib launcher."""
    common = (f"hydra/launcher={launcher}", "hydra.sweeper.max_batch_size=2")
    grid = _job_files(_sweep(tmp_path / "grid", data_cache, *common))
    basic = _job_files(_sweep(tmp_path / "basic", data_cache, *common, "hydra/sweeper=basic"))
    assert grid.keys() == basic.keys() and len(grid) == 1 + 3 * 5
    for name in grid:
        assert grid[name] == basic[name], name


class _Loader:
    """A stand-in for Hydra's config loader that records what it is asked to compose."""

    def __init__(self):
        self.asked = []

    def load_sweep_config(self, master, overrides):
        self.asked.append(list(overrides))
        return "composed"


def _master():
    from omegaconf import OmegaConf

    return OmegaConf.create({"hydra": {"overrides": {"hydra": ["hydra.sweep.dir=/s", "hydra.mode=MULTIRUN"]},
                                       "job": {"config_name": "train"}}})


def test_a_handed_config_is_taken_once_and_never_by_another_process():
    """The launcher gets the config composed for exactly its overrides (the master's Hydra overrides, then the
    job's), once; a second ask, other overrides, or a copy pickled for a worker process compose as Hydra would."""
    import pickle

    from omegaconf import OmegaConf

    from mhalab.runs import sweeper

    sweeper.forget()
    job = OmegaConf.create({"seed": 0})
    sweeper.hand_on("train", ["hydra.sweep.dir=/s", "hydra.mode=MULTIRUN", "seed=0"], job)
    loader = sweeper.HandedConfigs(_Loader())
    worker = pickle.loads(pickle.dumps(loader))
    assert worker.load_sweep_config(_master(), ["seed=0"]) == "composed"  # the store stays in this process
    assert loader.load_sweep_config(_master(), ["seed=1"]) == "composed"
    assert loader.load_sweep_config(_master(), ["seed=0"]) is job and sweeper.handed() == 0
    assert loader.load_sweep_config(_master(), ["seed=0"]) == "composed"
    assert loader.loader.asked == [["seed=1"], ["seed=0"]] and worker.loader.asked == [["seed=0"]]


def test_grid_sweepers_are_hydras_basic_and_mhalabs():
    from mhalab.runs.sweeper import is_grid

    assert is_grid("hydra._internal.core_plugins.basic_sweeper.BasicSweeper")
    assert is_grid("hydra_plugins.mhalab_sweeper.GridSweeper")
    assert not is_grid("hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper")
