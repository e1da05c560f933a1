"""No code from configs: every way a config could make mhalab run code is refused before anything is instantiated,
and the payload never runs. User code runs only when the user's config allows its package explicitly."""

import os
import pickle
import subprocess
import sys

import pytest

from mhalab.errors import ConfigError
from mhalab.runs.preflight import preflight


class Payload:
    """Unpickling this touches a marker file: proof that code from a file ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def evil(tmp_path):
    """(path of a pickle that would touch a marker, the marker's path)."""
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    path.write_bytes(pickle.dumps(Payload(marker)))
    return path, marker


def vectors(tmp_path, evil_pt):
    target = f"{tmp_path}/opened"
    return {
        "logger torch.load": [f"+logger.evil={{_target_:torch.load,f:{evil_pt},weights_only:false}}"],
        "callback torch.load": [f"+callbacks.evil={{_target_:torch.load,f:{evil_pt},weights_only:false}}"],
        "hydra callback open": [f"+hydra.callbacks.x={{_target_:builtins.open,file:{target},mode:w}}"],
        "nested target": [f"+callbacks.x={{_target_:mhalab.training.callbacks.ProgressLog,"
                          f"every_n_steps:{{_target_:os.system,command:'touch {target}'}}}}"],
        "mhalab function": ["+callbacks.x={_target_:mhalab.training.checkpoint.load_checkpoint,path:x.ckpt}"],
        "torch class": ["+callbacks.x={_target_:torch.nn.Linear,in_features:1,out_features:1}"],
        "launcher": ["hydra.launcher._target_=subprocess.Popen"],
        "sweeper": ["hydra.sweeper._target_=os.system"],
        "logging class": ["hydra.job_logging.handlers.console.class=subprocess.Popen"],
        "environment": ["+hydra.job.env_set.LD_PRELOAD=/tmp/evil.so"],
        "interpolated target": ["+callbacks.x={_target_:'${oc.env:EVIL_TARGET,os.system}'}"],
        "a config granting itself": ["allowed_targets=[builtins.]", "+callbacks.x={_target_:builtins.open}"],
        "user code not allowed": ["+callbacks.x={_target_:mycb.Hello}"],
    }


def test_every_code_execution_vector_is_refused_and_nothing_runs(tmp_path, evil):
    evil_pt, marker = evil
    cases = vectors(tmp_path, evil_pt)
    for name, overrides in cases.items():
        with pytest.raises(ConfigError) as e:
            preflight([f"paths.root_dir={tmp_path}", *overrides])
        assert "\n" not in str(e.value), name
    assert not marker.exists() and not (tmp_path / "opened").exists()
    assert not (tmp_path / "logs").exists()
    assert len(cases) >= 12


def test_vectors_in_a_config_folder_are_refused_too(tmp_path, evil):
    evil_pt, marker = evil
    conf = tmp_path / "myconf"
    (conf / "experiment").mkdir(parents=True)
    (conf / "experiment" / "evil.yaml").write_text(
        f"# @package _global_\nlogger:\n  evil:\n    _target_: torch.load\n    f: {evil_pt}\n    weights_only: false\n")
    (conf / "hydra" / "job_logging").mkdir(parents=True)
    (conf / "hydra" / "job_logging" / "evil.yaml").write_text(
        f"version: 1\nhandlers:\n  x:\n    '()': os.system\n    command: touch {marker}\nroot:\n  handlers: [x]\n")
    for override, message in (("experiment=evil", "torch.load"), ("hydra/job_logging=evil", "factories")):
        with pytest.raises(ConfigError, match=message):
            preflight(["--config-dir", str(conf), f"paths.root_dir={tmp_path}", override])
    assert not marker.exists()


@pytest.mark.proc
def test_the_real_command_refuses_with_exit_2_and_the_payload_never_runs(tmp_path, evil):
    evil_pt, marker = evil
    r = subprocess.run([sys.executable, "-m", "mhalab", "train", f"paths.root_dir={tmp_path}",
                        f"+hydra.callbacks.x={{_target_:torch.load,f:{evil_pt},weights_only:false}}"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "hydra.callbacks.x._target_='torch.load'" in r.stderr and "Traceback" not in r.stderr
    assert not marker.exists() and not (tmp_path / "logs").exists()


def test_user_code_runs_when_the_command_line_grants_its_package(tmp_path, monkeypatch):
    (tmp_path / "grantedcb.py").write_text("import lightning as L\nimport torch\nclass Hello(L.Callback):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("MHALAB_ALLOW", raising=False)
    monkeypatch.delitem(sys.modules, "grantedcb", raising=False)
    plan = preflight(["--allow", "grantedcb", f"paths.root_dir={tmp_path}", "+callbacks.x={_target_:grantedcb.Hello}"])
    assert plan.jobs[0][1].callbacks.x._target_ == "grantedcb.Hello" and "--allow" not in plan.argv
    for target, message in (("grantedcb.torch.load", "a function"), ("grantedcb.torch.Tensor", "outside the granted"),
                            ("grantedcb.L.Callback", "outside the granted")):
        with pytest.raises(ConfigError, match=message):
            preflight([f"paths.root_dir={tmp_path}", f"+callbacks.x={{_target_:{target}}}"])
    monkeypatch.delenv("MHALAB_ALLOW")
    with pytest.raises(ConfigError, match="--allow grantedcb"):
        preflight([f"paths.root_dir={tmp_path}", "+callbacks.x={_target_:grantedcb.Hello}"])


def test_grants_are_only_for_your_own_packages(monkeypatch):
    from mhalab.targets import grant

    monkeypatch.delenv("MHALAB_ALLOW", raising=False)
    for bad in ("os", "builtins", "torch", "mhalab", "a.b", ""):
        with pytest.raises(ConfigError):
            grant([bad])


def test_every_allow_listed_class_of_mhalab_and_lightning_exists_and_is_a_class():
    import importlib
    import inspect

    from mhalab.targets import ALLOWED_CLASSES, OWN_CLASSES

    for target in sorted(OWN_CLASSES | {t for t in ALLOWED_CLASSES if t.startswith("lightning.")}):
        module, _, name = target.rpartition(".")
        assert inspect.isclass(getattr(importlib.import_module(module), name)), target


def test_slurm_sweep_passes_the_real_preflight(tmp_path, monkeypatch):
    """submitit's `setup: Optional[List[str]] = None` is walked without error (issue 17). The cluster's own check of
    the resources (sbatch --test-only) needs a cluster: tests/runs/test_slurm.py runs it on a real one."""
    monkeypatch.setattr("mhalab.runs.slurm.check_launcher", lambda cfg, n_jobs: None)
    plan = preflight(["-m", "hydra/launcher=slurm", f"paths.root_dir={tmp_path}", "seed=0,1"])
    assert plan.multirun and [job[-1] for job, _ in plan.jobs] == ["seed=0", "seed=1"]
    assert not (tmp_path / "logs" / "train").exists()
