"""A run directory you did not write runs no code and makes mhalab write nothing outside it (issue 24, "Trust
boundaries"; docs/runs.md's "A copied run directory is self-contained").

One tiny run is trained once; each vector is a copy of it with a payload (in summary.json, .hydra/config.yaml, a
checkpoint's hyperparameters, or a planted link) that would create a marker file or write into `outside/`, and a real
`mhalab plots`, `ablate`, `convert`, `report` or `mhalab train resume=<dir>` process reads it. Each asserts: no
marker, the expected exit status (2 with one sentence on stderr where the input is refused, 0 where the command
never uses the field), and nothing new outside the copy and the command's own working folder.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TINY, slow_except

pytestmark = pytest.mark.proc  # every test here starts real processes

TIMEOUT = 180
MARKERS = ("pwned", "pwned-pth", "pwned-import", "site/evil.pth")  # what a payload that ran leaves


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    """The workspace: a finished tiny run (base/), the attacker's files, and outside/, which must stay empty."""
    ws = tmp_path_factory.mktemp("rundir")
    for name in ("outside", "site", "cwd", "train", "lib/evilpkg"):
        (ws / name).mkdir(parents=True)
    (ws / "evil.pth").write_text(f"import os; os.system('touch {ws}/pwned-pth')\n")
    (ws / "lib" / "evilpkg" / "__init__.py").write_text(  # a user package on PYTHONPATH: importing it leaves a mark
        f"open({str(ws / 'pwned-import')!r}, 'w').close()\n\nclass Task:\n    pass\n")
    r = subprocess.run([sys.executable, "-P", "-m", "mhalab", "train", *TINY, f"data.cache_dir={ws}/cache"],
                       cwd=ws / "train", env=_env(ws, ws / "train"), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    (run,) = [p.parent for p in (ws / "train").rglob("summary.json")]
    shutil.copytree(run, ws / "base", symlinks=True)
    return ws


def _env(ws: Path, root: Path) -> dict:
    path = os.pathsep.join(p for p in (str(ws / "lib"), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "MHALAB_ROOT": str(root), "WANDB_SILENT": "true"}
    for key in ("MHALAB_ALLOW", "MHALAB_RUN_ID"):
        env.pop(key, None)
    return env


def _files(ws: Path, skip: Path) -> set[str]:
    """Every path under ws but the vector's copy, the working folder and the trained original."""
    skipped = (skip, ws / "cwd", ws / "train")
    return {str(p) for p in ws.rglob("*") if not any(p == s or s in p.parents for s in skipped)}


# -- what each vector does to its copy of the run ---------------------------------------------------------------

def source(value):
    """summary.json's config.data.source set to `value` (the ws path written as {ws})."""
    def edit(run: Path, ws: Path):
        summary(run, lambda d: d["config"]["data"].__setitem__("source", _fill(value, ws)))
    return edit


def _fill(value, ws: Path):
    text = json.dumps(value).replace("{ws}", str(ws))
    return json.loads(text)


def summary(run: Path, change):
    d = json.loads((run / "summary.json").read_text())
    change(d)
    (run / "summary.json").write_text(json.dumps(d))


def set_key(*path, value):
    def edit(run: Path, ws: Path):
        def change(d):
            for key in path[:-1]:
                d = d[key]
            d[path[-1]] = _fill(value, ws)
        summary(run, change)
    return edit


def hydra_config(run: Path, ws: Path):
    (run / ".hydra" / "config.yaml").write_text(
        f"data:\n  source:\n    _target_: builtins.open\n    file: {ws}/pwned\n    mode: w\n"
        f"callbacks:\n  x:\n    _target_: os.system\n    command: touch {ws}/pwned\n")


def hparams(extra: dict, arch: dict | None = None):
    """The checkpoints' hyper_parameters with `extra` keys (and `arch` entries) added, written with torch.save."""
    def edit(run: Path, ws: Path):
        import torch

        for ckpt in (run / "checkpoints").glob("*.ckpt"):
            c = torch.load(ckpt, map_location="cpu", weights_only=True)
            c["hyper_parameters"].update(_fill(extra, ws))
            c["hyper_parameters"]["arch"].update(_fill(arch or {}, ws))
            torch.save(c, ckpt)
    return edit


def link(name: str, target: str):
    def edit(run: Path, ws: Path):
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        if (run / name).is_dir():
            shutil.rmtree(run / name)
        (run / name).unlink(missing_ok=True)
        (ws / "outside" / "victim").write_text("mine\n") if target == "outside/victim" else None
        (run / name).symlink_to(ws / target)
    return edit


def interrupted(run: Path, ws: Path):
    summary(run, lambda d: d.__setitem__("status", "interrupted"))


def truncate_last(run: Path, ws: Path):
    interrupted(run, ws)
    last = run / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])


def both(*edits):
    def edit(run: Path, ws: Path):
        for e in edits:
            e(run, ws)
    return edit


OPEN = {"_target_": "builtins.open", "file": "{ws}/pwned", "mode": "w"}
SYSTEM = {"_target_": "os.system", "command": "touch {ws}/pwned"}
COPY = {"_target_": "shutil.copyfile", "src": "{ws}/evil.pth", "dst": "{ws}/site/evil.pth"}
WRITE_TEXT = {"_target_": "pathlib.Path.write_text", "_args_": [{"_target_": "pathlib.Path", "_args_": ["{ws}/pwned"]},
                                                                  "x"]}
NESTED = {"_target_": "mhalab.training.callbacks.ProgressLog", "every_n_steps": OPEN}  # an allowed class, bad args
NO_TOP = {"tasks": [OPEN]}  # no _target_ at the top: instantiate still builds the nested one
INTERPOLATED = {"_target_": "mhalab.training.callbacks.ProgressLog",
                "every_n_steps": "${oc.create:{_target_: builtins.open, file: '{ws}/pwned', mode: w}}"}
USER = {"_target_": "evilpkg.Task"}

# (name, command, edit, expected exit status, stderr must say)
VECTORS = [
    ("copyfile_plots", "plots", source(COPY), 2, "shutil.copyfile"),
    ("open_ablate", "ablate", source(OPEN), 2, "builtins.open"),
    ("open_convert", "convert", source(OPEN), 2, "builtins.open"),
    ("system_plots", "plots", source(SYSTEM), 2, "os.system"),
    ("write_text_ablate", "ablate", source(WRITE_TEXT), 2, "pathlib.Path"),
    ("user_class_plots", "plots", source(USER), 2, "--allow evilpkg"),
    ("nested_args_ablate", "ablate", source(NESTED), 2, "builtins.open"),
    ("nested_no_top_convert", "convert", source(NO_TOP), 2, "builtins.open"),
    ("interpolation_plots", "plots", source(INTERPOLATED), 2, "interpolation"),
    ("copyfile_report", "report", source(COPY), 0, None),  # report never builds the data
    ("hydra_config_plots", "plots", hydra_config, 0, None),  # analysis never reads .hydra/
    ("hydra_config_report", "report", hydra_config, 0, None),
    ("hparams_ablate", "ablate", hparams({"_target_": "builtins.open", "evil": OPEN}), 0, None),  # only arch, optim
    ("hparams_arch_convert", "convert", hparams({}, {"_target_": "builtins.open"}), 2, "_target_"),
    ("best_escapes_plots", "plots", set_key("checkpoints", "best", value="../../outside/x.ckpt"), 2, "checkpoints"),
    ("plots_escape_plots", "plots", set_key("plots", value=["../outside/p.png"]), 2, "plots"),
    ("seed_path_convert", "convert", set_key("config", "seed", value="../../outside/x"), 2, "config"),
    ("cache_dirs_plots", "plots", both(set_key("config", "data", "cache_dir", value="{ws}/outside/cache"),
                                       set_key("config", "data", "hf_cache_dir", value="{ws}/outside/hf")), 0, None),
    ("stat_name_plots", "plots", set_key("head_stats", value={"x/../../../outside/y": [[0.5, 0.5]]}), 2,
     "head_stats"),
    ("task_slash_plots", "plots", set_key("config", "data", "task", value="../../outside/t"), 2, "data.task"),
    ("ablation_link_ablate", "ablate", link("ablation", "outside"), 2, "symbolic link"),
    ("report_file_link_report", "report", link("report/report.json", "outside/victim"), 2, "symbolic link"),
    ("convert_link_convert", "convert", link("convert_gqa1", "outside"), 2, "symbolic link"),
    ("payloads_resume", "resume", both(interrupted, hydra_config, source(COPY),
                                       hparams({"_target_": "builtins.open", "evil": OPEN})), 0, None),
    ("csv_link_resume", "resume", both(interrupted, link("csv", "outside")), 2, "symbolic link"),
    ("train_log_link_resume", "resume", both(interrupted, link("train.log", "outside/victim")), 2, "symbolic link"),
]


def command(kind: str, run: Path, ws: Path) -> list[str]:
    last = str(run / "checkpoints" / "last.ckpt")
    return {
        "plots": ["plots", str(run), "--max-tokens", "8"],
        "ablate": ["ablate", last, "--batches", "1", "--no-prune", "--threads", "1"],
        "convert": ["convert", last, "--n-kv-heads", "1", "--init", "mean", "--scratch", "none", "--no-mha-control",
                    "--batches", "1", "--threads", "1"],
        "report": ["report", str(run), "--no-plots"],
        "resume": ["train", *TINY, f"data.cache_dir={ws}/cache", f"resume={run}"],
    }[kind]


def attack(ws: Path, name: str, kind: str, edit, extra=(), marks=()) -> tuple[subprocess.CompletedProcess, Path]:
    """Copy the run, apply `edit`, run the command; nothing may appear outside the copy but `marks`."""
    run = ws / "vectors" / name / "run"
    for marker in MARKERS:  # each vector on its own: what an earlier one left (before the fix) is gone
        (ws / marker).unlink(missing_ok=True)
    shutil.rmtree(ws / "outside")
    (ws / "outside").mkdir()
    shutil.copytree(ws / "base", run, symlinks=True)
    edit(run, ws)
    before = _files(ws, run.parent)
    r = subprocess.run([sys.executable, "-P", "-m", "mhalab", *command(kind, run, ws), *extra], cwd=ws / "cwd",
                       env=_env(ws, ws / "cwd"), capture_output=True, text=True, timeout=TIMEOUT)
    after = _files(ws, run.parent) - {str(ws / m) for m in marks}
    assert after == before, f"{name} wrote outside: {after - before}"
    return r, run


# One vector of each command and outcome in the default suite, every vector under `pytest -m slow` (CI runs both).
DEFAULT_VECTORS = {"copyfile_plots", "open_ablate", "open_convert", "copyfile_report", "hydra_config_plots",
                   "hparams_ablate", "payloads_resume", "csv_link_resume", "report_file_link_report"}


@pytest.mark.parametrize("name,kind,edit,code,says", slow_except(VECTORS, DEFAULT_VECTORS, key=lambda v: v[0]),
                         ids=[v[0] for v in VECTORS])
def test_vector(ws, name, kind, edit, code, says):
    r, run = attack(ws, name, kind, edit)
    for marker in MARKERS:
        assert not (ws / marker).exists(), f"{name}: the payload ran ({marker})"
    assert not any((ws / "outside").iterdir()) or {p.name for p in (ws / "outside").iterdir()} == {"victim"}
    if (ws / "outside" / "victim").exists():
        assert (ws / "outside" / "victim").read_text() == "mine\n"
    assert r.returncode == code, f"{name}: exit {r.returncode}\n{r.stderr[-3000:]}"
    if code == 2:
        errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and says in errors[0], r.stderr[-3000:]
        assert "Traceback" not in r.stderr


def test_grant_comes_from_this_command(ws):
    """The same user class named in a summary is imported once this command grants its package (--allow): the grant
    is the person's, and it works."""
    r, run = attack(ws, "user_class_granted", "plots", source(USER), extra=["--allow", "evilpkg"],
                    marks=["pwned-import"])
    assert (ws / "pwned-import").exists()
    (ws / "pwned-import").unlink()
    assert r.returncode == 2 and "must build an object with an `info`" in r.stderr, r.stderr[-2000:]


def test_damaged_last_checkpoint_on_resume(ws):
    """A truncated last.ckpt is named in one sentence with the intact checkpoint beside it; the run's summary is
    left as it was (interrupted), and nothing trains."""
    r, run = attack(ws, "truncated_resume", "resume", truncate_last)
    assert r.returncode == 2, r.stderr[-3000:]
    (error,) = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    (best,) = (run / "checkpoints").glob("best-*.ckpt")
    assert f"cannot resume from {run / 'checkpoints' / 'last.ckpt'}" in error
    assert f"the newest intact checkpoint is {best} (step 3)" in error
    assert json.loads((run / "summary.json").read_text())["status"] == "interrupted"
