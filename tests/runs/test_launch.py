"""A single run starts from the config its preflight composed and checked (`mhalab.runs.launch`, issue 26), not
from two more compositions by `hydra.main`, and ends exactly as under `hydra.main`. Tried on real `mhalab train`
processes: compositions counted by cProfile in the run's own process, the results compared file by file with the
same run started by `hydra.main` itself."""

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from conftest import TINY, compositions, proc_env

# the same run under hydra.main, as `mhalab train` started it before (the preflight's registrations, then Hydra)
UNDER_HYDRA_MAIN = """
import sys, hydra
from mhalab.config.schema import register
from mhalab.runs.preflight import new_command, register_resolvers
from mhalab.training import train
register(); register_resolvers(); new_command()
sys.argv = sys.argv[:1] + sys.argv[2:]
hydra.main(version_base="1.3", config_path=train.CONFIG_PATH, config_name="train")(train.run)()
"""



def _run(run_dir: Path, data_cache, *, under_hydra_main: bool = False, profile: Path | None = None) -> Path:
    run_dir.parent.mkdir(parents=True)
    args = [*TINY, f"hydra.run.dir={run_dir}", f"data.cache_dir={data_cache}", f"paths.root_dir={run_dir.parent}"]
    if under_hydra_main:
        cmd = [sys.executable, "-c", UNDER_HYDRA_MAIN, "train", *args]
    elif profile is not None:
        cmd = [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "mhalab", "train", *args]
    else:
        cmd = [sys.executable, "-m", "mhalab", "train", *args]
    r = subprocess.run(cmd, cwd=run_dir.parent, env=proc_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return run_dir



def _files(run_dir: Path) -> dict[str, object]:
    """What a run wrote that must not depend on how it was launched, its own folder's name taken out."""
    def anonymous(text: str) -> str:
        return text.replace(str(run_dir), "<run>").replace(str(run_dir.parent), "<root>")

    summary = json.loads((run_dir / "summary.json").read_text())
    kept = {k: summary[k] for k in ("status", "metrics", "test_metrics", "history", "head_stats", "overrides",
                                    "config")}
    files: dict[str, object] = {"summary": json.loads(anonymous(json.dumps(kept)))}
    (csv,) = run_dir.glob("csv/**/metrics.csv")
    files["metrics.csv"] = csv.read_bytes()
    for name in ("config.yaml", "overrides.yaml", "hydra.yaml"):
        files[name] = yaml.safe_load(anonymous((run_dir / ".hydra" / name).read_text()))
    return files


@pytest.mark.proc
@pytest.mark.slow  # a cost property; the default suite keeps test_a_single_run_ends_as_under_hydra_main
def test_a_single_run_composes_its_config_once(tmp_path, data_cache):
    """The preflight composes the run's config; the run starts from it (hydra.main composed it twice more)."""
    prof = tmp_path / "run.prof"
    run_dir = _run(tmp_path / "a" / "run", data_cache, profile=prof)
    assert (run_dir / "summary.json").is_file()
    assert compositions(prof) == 1


@pytest.mark.proc
@pytest.mark.slow
def test_a_single_run_ends_as_under_hydra_main(tmp_path, data_cache):
    """The same config, Hydra config (`hydra.mode=RUN` among its overrides, as hydra.main adds it), overrides,
    metrics.csv (byte for byte) and summary figures as the same run started by `hydra.main`."""
    launched = _files(_run(tmp_path / "a" / "run", data_cache))
    under_main = _files(_run(tmp_path / "b" / "run", data_cache, under_hydra_main=True))
    assert launched.keys() == under_main.keys()
    for name in launched:
        assert launched[name] == under_main[name], name
    assert launched["hydra.yaml"]["hydra"]["mode"] == "RUN"
    assert launched["hydra.yaml"]["hydra"]["overrides"]["hydra"][-1] == "hydra.mode=RUN"


class Recorder:
    """A Hydra callback (`hydra.callbacks`) that records what it is told; `fail` names an event that raises."""

    events: list = []

    def __init__(self, name: str, fail: str = "") -> None:
        self.name, self.fail = name, fail

    def __getattr__(self, event: str):
        if not event.startswith("on_"):
            raise AttributeError(event)

        def told(**kwargs):
            Recorder.events.append((self.name, event))
            if event == self.fail:
                raise RuntimeError("broken")
        return told


def test_hydra_callbacks_are_told_in_hydras_order():
    """In order at a start, in reverse at an end, as hydra-core 1.3's Callbacks; one that raises is a warning."""
    from omegaconf import OmegaConf

    from mhalab.runs.launch import HydraCallbacks

    target = f"{__name__}.Recorder"
    cfg = OmegaConf.create({"hydra": {"callbacks": {"a": {"_target_": target, "name": "a"},
                                                    "b": {"_target_": target, "name": "b", "fail": "on_job_end"}}}})
    Recorder.events = []
    callbacks = HydraCallbacks(cfg)
    callbacks.on_run_start(config=cfg, config_name="train")
    callbacks.on_job_start(config=cfg, task_function=print)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        callbacks.on_job_end(config=cfg, job_return=None)
    callbacks.on_run_end(config=cfg, config_name="train", job_return=None)
    assert Recorder.events == [("a", "on_run_start"), ("b", "on_run_start"), ("a", "on_job_start"),
                               ("b", "on_job_start"), ("b", "on_job_end"), ("a", "on_job_end"), ("b", "on_run_end"),
                               ("a", "on_run_end")]
    assert [str(w.message) for w in caught] == ["Callback Recorder.on_job_end raised RuntimeError: broken"]
    assert HydraCallbacks(OmegaConf.create({"hydra": {"callbacks": None}})).callbacks == []
