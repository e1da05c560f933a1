"""Configs cannot run code or write outside the run: every attack vector is run as a real `mhalab train` process in
a folder an attacker prepared (a pickle, a module and a Hydra plugin that would run on import, config folders),
each payload would create a marker file, and each command must end with one sentence and exit status 2 before
anything runs (issue 16; docs/troubleshooting.md's "No code from configs")."""

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import refusal, slow_except

REPO = Path(__file__).resolve().parents[2]


class Payload:
    """Unpickling this creates the marker: proof that code from a file ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    """The attacker's folder: `python -m mhalab` would put it first on the import path."""
    ws = tmp_path_factory.mktemp("attacker")
    mark = ws / "pwned"
    code = f"open({str(mark)!r}, 'w').close()\n"
    (ws / "evil.pt").write_bytes(pickle.dumps(Payload(mark)))
    (ws / "evil.pickle").write_bytes(pickle.dumps(Payload(mark)))
    (ws / "evilmod.py").write_text(code + "def space(cfg, trial):\n    pass\nx = 1\n")
    (ws / "yaml_trap").mkdir()
    (ws / "hydra_plugins").mkdir()
    (ws / "hydra_plugins" / "evil_plugin.py").write_text(code)
    (ws / "lib" / "mytasks").mkdir(parents=True)  # the user's own package, on PYTHONPATH and granted
    (ws / "lib" / "mytasks" / "__init__.py").write_text(
        "import os\nimport pickle\nimport torch\n\ndef helper(file, mode):\n    return open(file, mode)\n")
    cb = ws / "cb"
    (cb / "experiment").mkdir(parents=True)
    (cb / "experiment" / "evil.yaml").write_text(
        f"# @package _global_\nlogger:\n  evil:\n    _target_: torch.load\n    f: {ws}/evil.pt\n    weights_only: false\n")
    (cb / "experiment" / "grant.yaml").write_text(
        f"# @package _global_\nallowed_targets: [builtins.]\ncallbacks:\n  x:\n    _target_: builtins.open\n"
        f"    file: {mark}\n    mode: w\n")
    (cb / "experiment" / "searchpath.yaml").write_text("# @package _global_\nhydra:\n  searchpath: [pkg://evilmod]\n")
    (cb / "hydra" / "job_logging").mkdir(parents=True)
    (cb / "hydra" / "job_logging" / "evil.yaml").write_text(
        f"version: 1\nhandlers:\n  x:\n    '()': os.system\n    command: touch {mark}\nroot:\n  handlers: [x]\n")
    (cb / "hydra" / "job_logging" / "dot.yaml").write_text(
        "version: 1\nhandlers:\n  x:\n    class: logging.StreamHandler\n    '.': {emit: x}\nroot:\n  handlers: [x]\n")
    (cb / "hydra" / "hydra_logging").mkdir(parents=True)
    (cb / "hydra" / "hydra_logging" / "evil.yaml").write_text(
        f"version: 1\nfilters:\n  x:\n    '()': os.system\n    command: touch {mark}\n")
    (cb / "hydra" / "job_logging" / "fileconfig.yaml").write_text(
        f"version: 1\nhandlers:\n  x:\n    class: logging.config.fileConfig\n    fname: {ws}/evil.ini\n"
        "root:\n  handlers: [x]\n")
    (ws / "bin").mkdir()  # a stand-in for the cluster's sbatch: keeps the batch script it is given (outside)
    (ws / "bin" / "sbatch").write_text(f"#!/bin/sh\nmkdir -p {ws}/outside\ncat > {ws}/outside/batch-script\n"
                                       "echo 'sbatch: error: stand-in' >&2\nexit 1\n")
    (ws / "bin" / "sbatch").chmod(0o755)
    load = f"{{_target_: torch.load, f: {ws}/evil.pt, weights_only: false}}"  # what a resolver would hide
    for name, key, value in (
            ("create_logger", "logger.x", f"${{oc.create:{load}}}"),
            ("create_callback", "callbacks.x", f"${{oc.create:{load}}}"),
            ("create_hydra_callback", "hydra.callbacks.x", f"${{oc.create:{load}}}"),
            ("create_source", "data.source", f"${{oc.create:{load}}}"),
            ("create_extra", "stats.extra.x", f"${{oc.create:{load}}}"),
            ("create_logging", "hydra.job_logging.handlers.x",
             f"${{oc.create:{{'()': torch.load, f: {ws}/evil.pt, weights_only: false}}}}"),
            ("decode_logger", "logger.x", f"${{oc.decode:'{load}'}}"),
            ("select_default", "logger.x", f"${{oc.select:nowhere,{load}}}"),
            ("select_list", "callbacks.x", f"${{oc.select:nowhere,[{load}]}}"),
            ("env_default", "logger.x", f"${{oc.env:NO_SUCH_VARIABLE,{load}}}"),
            ("resolver_name", "logger.x", f"${{oc.${{oc.env:EVIL_RESOLVER,create}}:'{load}'}}"),
            ("nested_create", "logger.x", f"${{oc.select:${{oc.create:{load}}}}}"),
            ("whole_node", "callbacks", f"${{oc.create:{{x: {load}}}}}"),
            ("slurm_comment", "hydra.launcher.comment", f"x\\ntouch {mark} #"),
            ("slurm_job_name", "hydra.job.name", f"x\\ntouch {mark} #")):
        *parents, last = key.split(".")
        text = "# @package _global_\n" + "".join(f"{'  ' * i}{p}:\n" for i, p in enumerate(parents))
        # a double-quoted YAML string: "\\n" is a line break
        (cb / "experiment" / f"{name}.yaml").write_text(text + f"{'  ' * len(parents)}{last}: \"{value}\"\n")
    primary = ws / "primary"
    primary.mkdir()
    (primary / "train.yaml").write_text(
        f"defaults:\n  - train_schema\n  - _self_\ncallbacks:\n  x:\n    _target_: builtins.open\n    file: {mark}\n"
        "    mode: w\n")
    (primary / "searchpath.yaml").write_text("hydra:\n  searchpath: [pkg://evilmod]\n")
    (primary / "rerun.yaml").write_text(
        f"defaults:\n  - train_schema\n  - _self_\nlogger:\n  x:\n    _target_: torch.load\n    f: {ws}/evil.pt\n"
        "    weights_only: false\n")
    return ws


def vectors(ws: Path) -> dict[str, list[str]]:
    """name -> the arguments of `mhalab train` (each payload creates ws/pwned, or writes under ws/outside);
    `ENV:KEY=VALUE` sets an environment variable instead."""
    mark, out = ws / "pwned", ws / "outside"
    sbatch = f"ENV:PATH={ws}/bin:{os.environ.get('PATH', '')}"  # SLURM vectors: the stand-in sbatch first on PATH
    return {
        # issue 16's five ways that ran code, and variants
        "experimental rerun": ["--experimental-rerun", f"{ws}/evil.pickle"],
        "experimental rerun with -m": ["-m", "--experimental-rerun", f"{ws}/evil.pickle"],
        "-cp folder": ["-cp", f"{ws}/primary"],
        "--config-path folder": [f"--config-path={ws}/primary"],
        "-cp folder -cn": ["-cp", f"{ws}/primary", "-cn", "rerun"],
        "-cp relative folder": ["-cp", "../../../../../../../../../" + str(ws / "primary")],
        "--config-dir experiment": ["--config-dir", f"{ws}/cb", "experiment=evil"],
        "-cd experiment": ["-cd", f"{ws}/cb", "experiment=evil"],
        "config grants itself": ["--config-dir", f"{ws}/cb", "experiment=grant"],
        "config grants itself, sweep": ["-m", "--config-dir", f"{ws}/cb", "experiment=grant", "seed=0,1"],
        "allowed_targets override": ["allowed_targets=[builtins.]", f"+callbacks.x={{_target_:builtins.open,file:{mark},mode:w}}"],
        "granted prefix reaches torch.load": ["--allow", "mytasks",
                                              f"+callbacks.x={{_target_:mytasks.torch.load,f:{ws}/evil.pt,weights_only:false}}"],
        "granted prefix reaches os.system": ["--allow", "mytasks", f"+callbacks.x={{_target_:mytasks.os.system,command:'touch {mark}'}}"],
        "granted prefix reaches pickle's class": ["--allow", "mytasks", "+callbacks.x={_target_:mytasks.pickle.Unpickler}"],
        "granted package's function": ["--allow", "mytasks", f"+callbacks.x={{_target_:mytasks.helper,file:{mark},mode:w}}"],
        "grant of os in the environment": ["ENV:MHALAB_ALLOW=os", f"+callbacks.x={{_target_:os.system,command:'touch {mark}'}}"],
        "grant of subprocess beside your own": ["+callbacks.x={_target_:subprocess.Popen,args:[touch,x]}",
                                                               "--allow", "mytasks,subprocess"],
        "grant of the standard library": ["--allow", "builtins", f"+callbacks.x={{_target_:builtins.open,file:{mark},mode:w}}"],
        "grant of os by --allow=": ["--allow=os", f"+callbacks.x={{_target_:os.system,command:'touch {mark}'}}"],
        "searchpath pkg://": ["hydra.searchpath=[pkg://evilmod]"],
        "searchpath pkg:// with -m": ["-m", "hydra.searchpath=[pkg://evilmod]", "seed=0,1"],
        "-cp pkg://": ["-cp", "pkg://evilmod"],
        "searchpath in a primary config": ["-cp", f"{ws}/primary", "-cn", "searchpath"],
        "searchpath with --cfg": ["--cfg", "job", "hydra.searchpath=[pkg://evilmod]"],
        "searchpath with --info": ["--info", "searchpath", "hydra.searchpath=[pkg://evilmod]"],
        # logging config
        "logging fileConfig class": ["--config-dir", f"{ws}/cb", "hydra/job_logging=fileconfig"],
        "logging factory from a file": ["--config-dir", f"{ws}/cb", "hydra/job_logging=evil"],
        "logging filter factory in hydra_logging": ["--config-dir", f"{ws}/cb", "hydra/hydra_logging=evil"],
        "logging class Popen": ["hydra.job_logging.handlers.console.class=subprocess.Popen"],
        "logging ext:// import": ["hydra.job_logging.handlers.console.stream=ext://evilmod.x"],
        "logging '.' attributes": ["--config-dir", f"{ws}/cb", "hydra/job_logging=dot"],
        "logging formatter class": ["+hydra.job_logging.formatters.evil={class:subprocess.Popen}"],
        "logging handler interpolated ext://": ["+hydra.job_logging.handlers.console.a=ext:/",
                                                "hydra.job_logging.handlers.console.stream=${.a}/evilmod.x"],
        # targets anywhere in the config
        "logger torch.load": [f"+logger.evil={{_target_:torch.load,f:{ws}/evil.pt,weights_only:false}}"],
        "callback torch.load": [f"+callbacks.evil={{_target_:torch.load,f:{ws}/evil.pt,weights_only:false}}"],
        "hydra callback open": [f"+hydra.callbacks.x={{_target_:builtins.open,file:{mark},mode:w}}"],
        "nested target": [f"+callbacks.x={{_target_:mhalab.training.callbacks.ProgressLog,every_n_steps:{{_target_:os.system,command:'touch {mark}'}}}}"],
        "target in a list": [f"+callbacks.x={{_target_:mhalab.training.callbacks.ProgressLog,every_n_steps:[{{_target_:os.system,command:'touch {mark}'}}]}}"],
        "data source target": [f"+data.source={{_target_:builtins.open,file:{mark},mode:w}}"],
        "mhalab function": ["+callbacks.x={_target_:mhalab.training.checkpoint.load_checkpoint,path:x.ckpt}"],
        "torch class": ["+callbacks.x={_target_:torch.nn.Linear,in_features:1,out_features:1}"],
        "interpolated target": ["+callbacks.x={_target_:'${oc.env:EVIL_TARGET,os.system}'}"],
        "launcher Popen": [f"hydra.launcher._target_=subprocess.Popen"],
        "sweeper os.system": ["-m", "hydra.sweeper._target_=os.system", "seed=0,1"],
        "hydra.mode=MULTIRUN without -m": ["hydra.mode=MULTIRUN", "seed=0,1",
                                           f"+callbacks.x={{_target_:os.system,command:'touch {mark}'}}"],
        "sweep job target": ["-m", "seed=0,1", f"+callbacks.x={{_target_:os.system,command:'touch {mark}'}}"],
        "environment LD_PRELOAD": ["+hydra.job.env_set.LD_PRELOAD=/tmp/evil.so"],
        "environment PYTHONPATH": [f"+hydra.job.env_set.PYTHONPATH={ws}"],
        # plugins' own code paths
        "slurm setup lines": [sbatch, "-m", "hydra/launcher=slurm", f"hydra.launcher.setup=['touch {mark}']", "seed=0,1"],
        "slurm srun_args": [sbatch, "-m", "hydra/launcher=slurm", "hydra.launcher.srun_args=['--prolog=/tmp/x']", "seed=0,1"],
        "slurm sbatch wrap": [sbatch, "-m", "hydra/launcher=slurm", f"+hydra.launcher.additional_parameters.wrap='touch {mark}'", "seed=0,1"],
        "optuna custom_search_space": ["-m", "hydra/sweeper=search", "+hydra.sweeper.custom_search_space=evilmod.space"],
        # writes outside the run directory, the logs and the cache
        "logging FileHandler outside": [f"hydra.job_logging.handlers.file.filename={out}/x.log"],
        "csv logger outside": [f"logger=csv", f"logger.csv.save_dir={out}"],
        "tensorboard logger outside": [f"logger=tensorboard", f"logger.tensorboard.save_dir={out}/../outside"],
        "wandb logger in the current directory": ["logger=wandb", "logger.wandb.save_dir=null"],
        "optuna storage outside": ["-m", "hydra/sweeper=search", f"hydra.sweeper.storage=sqlite:///{out}/s.db"],
        "optuna storage remote": ["-m", "hydra/sweeper=search", "hydra.sweeper.storage=postgresql://evil/db"],
        "hydra output_subdir outside": [f"hydra.output_subdir=../../../../../../../../..{out}"],
        "sweep subdir outside": ["-m", "seed=0,1", f"hydra.sweep.subdir=../../../../../../../../..{out}"],
        "joblib temp_folder outside": ["-m", "hydra/launcher=parallel", f"+hydra.launcher.temp_folder={out}", "seed=0,1"],
        # resolvers that make config nodes (a `_target_` among them) only when the config is resolved
        **{f"resolver {name}": ["--config-dir", f"{ws}/cb", f"experiment={name}"] for name in (
            "create_logger", "create_callback", "create_hydra_callback", "create_source", "create_extra",
            "create_logging", "decode_logger", "select_default", "select_list", "env_default", "resolver_name",
            "nested_create", "whole_node")},
        "resolver oc.create in an override": [f"+callbacks.x='${{oc.create:{{_target_:torch.load,f:{ws}/evil.pt,"
                                              "weights_only:false}}'"],
        # line breaks in launcher settings become commands of the SLURM batch script
        "slurm comment line break": [sbatch, "-m", "--config-dir", f"{ws}/cb", "hydra/launcher=slurm", "experiment=slurm_comment",
                                     "seed=0,1"],
        "slurm job name line break": [sbatch, "-m", "--config-dir", f"{ws}/cb", "hydra/launcher=slurm",
                                      "experiment=slurm_job_name", "seed=0,1"],
        # files whose name and content a config chooses, and loggers' folders
        "log file named .bashrc": [f"paths.log_dir={out}/home", f"hydra.job_logging.handlers.file.filename={out}/home/.bashrc",
                                   f"hydra.job_logging.formatters.simple.format='touch {mark} #%(message)s'"],
        "log file named .pth under the logs": [f"hydra.job_logging.handlers.file.filename={ws}/root/logs/evil.pth"],
        "csv logger name outside": ["logger=csv", f"logger.csv.name=../../../../../../../../../..{out}"],
        "csv logger version outside": ["logger=csv", f"logger.csv.version=../../../../../../../../../..{out}"],
        "tensorboard logger sub_dir outside": ["logger=tensorboard", f"+logger.tensorboard.sub_dir={out}"],
        # flags
        "shell completion": ["--shell-completion", "query=train"],
        "unknown flag": ["--evil-flag"],
        "bad value inf": ["model.rope_base=inf"],
    }


VECTORS = sorted(vectors(Path("/ws")))
# One or two vectors of each kind above in the default suite, every vector under `pytest -m slow` (CI runs both):
# each is a real `mhalab train` process, about a second and a half on a 2-core machine.
DEFAULT_VECTORS = {"experimental rerun", "-cp folder", "--config-dir experiment", "config grants itself, sweep",
                   "granted prefix reaches os.system", "grant of os in the environment", "searchpath pkg:// with -m",
                   "logging fileConfig class", "logging ext:// import", "callback torch.load", "interpolated target",
                   "sweep job target", "environment LD_PRELOAD", "slurm setup lines", "optuna custom_search_space",
                   "logging FileHandler outside", "csv logger outside", "optuna storage remote",
                   "resolver oc.create in an override", "slurm comment line break", "log file named .bashrc",
                   "shell completion", "bad value inf"}


def test_at_least_forty_vectors():
    assert len(VECTORS) >= 40 and DEFAULT_VECTORS <= set(VECTORS)


@pytest.mark.proc
@pytest.mark.parametrize("name", slow_except(VECTORS, DEFAULT_VECTORS))
def test_vector_is_refused_in_one_sentence_and_nothing_runs(ws, name):
    mark, out = ws / "pwned", ws / "outside"
    mark.unlink(missing_ok=True)
    shutil.rmtree(out, ignore_errors=True)  # each vector on its own: one that wrote outside fails only itself
    shutil.rmtree(ws / "root", ignore_errors=True)
    env = {**os.environ, "MHALAB_ROOT": str(ws / "root"), "WANDB_MODE": "disabled", "EVIL_TARGET": "os.system"}
    env.pop("MHALAB_ALLOW", None)
    env["PYTHONPATH"] = f"{REPO / 'src'}:{ws / 'lib'}"  # the attacker's folder is only the current directory
    args = vectors(ws)[name]
    env.update(a[4:].split("=", 1) for a in args if a.startswith("ENV:"))
    r = subprocess.run([sys.executable, "-m", "mhalab", "train", *(a for a in args if not a.startswith("ENV:"))],
                       cwd=ws, env=env,
                       capture_output=True, text=True, timeout=180)
    refusal(r)
    assert not mark.exists(), f"{name}: the payload ran"
    assert not out.exists(), f"{name}: wrote outside the run"
    assert not (ws / "root" / "logs").exists(), f"{name}: a run directory was made"
