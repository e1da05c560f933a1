"""Runs before they start: composing and checking their configs, where they live, resuming and locking them.

`preflight(argv)` runs before Hydra does anything: it composes the config of every job the command would run
(a multirun's sweep expanded), refuses any `_target_` outside the allow-list (`mhalab.targets`), builds the typed
config (`mhalab.schema`) so every value is checked, and settles `resume`. So a bad value, an unsafe target or a
wrong resume is one sentence and exit 2, with no run directory, no file written and no code run. It imports no
torch or Lightning, so it answers in about a second.

Run directories: `<paths.log_dir>/<task_name>/runs/<run id>` (multiruns: `.../multiruns/<run id>/<job>`), the run
id being the time to the microsecond, the process id and random bits (`${mhalab.run_id:}`, one per process).
"""

from __future__ import annotations

import fcntl
import os
import secrets
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mhalab.errors import ConfigError
from mhalab.summary import SUMMARY

CONFIG_MODULE = "mhalab.conf"
CONFIG_NAME = "train"
LAST = Path("checkpoints") / "last.ckpt"
LOCK = ".lock"
HYDRA_FLAGS_WITHOUT_RUN = ("help", "hydra_help", "cfg", "info", "shell_completion")
_RUN_ID: list[str] = []


def new_run_id() -> str:
    """Time to the microsecond, process id and random bits: unique even for jobs started in the same second."""
    return f"{datetime.now():%Y-%m-%d_%H-%M-%S_%f}_{os.getpid()}_{secrets.token_hex(2)}"


def run_id() -> str:
    """The current command's run id (made on first use; `new_command()` starts another)."""
    if not _RUN_ID:
        _RUN_ID.append(new_run_id())
    return _RUN_ID[0]


def new_command() -> None:
    """Forget the run id: the next `run_id()` is a new one (each `mhalab train` command gets its own)."""
    _RUN_ID.clear()


def register_resolvers() -> None:
    """`${mhalab.cwd:}` (the current directory) and `${mhalab.run_id:}` for the configs; idempotent."""
    if not OmegaConf.has_resolver("mhalab.cwd"):
        OmegaConf.register_new_resolver("mhalab.cwd", os.getcwd)
    if not OmegaConf.has_resolver("mhalab.run_id"):
        OmegaConf.register_new_resolver("mhalab.run_id", run_id)


# -- composing and checking ------------------------------------------------------------------------------------

def parse_args(argv: list[str]):
    """Hydra's own command-line parser (the same flags as `@hydra.main`)."""
    from hydra._internal.utils import get_args_parser

    return get_args_parser().parse_args(argv)


def compose(overrides: list[str], config_dir: str | None = None, config_name: str | None = None) -> DictConfig:
    """The composed config (Hydra's node included) for these overrides, as `@hydra.main` would compose it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from mhalab.schema import register

    register()
    register_resolvers()
    extra = [f"hydra.searchpath=[file://{Path(config_dir).resolve()}]"] if config_dir else []
    try:
        with initialize_config_module(CONFIG_MODULE, version_base="1.3"):
            return hydra_compose(config_name or CONFIG_NAME, overrides=list(overrides) + extra,
                                 return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(hydra_message(e)) from None
    except Exception as e:  # noqa: BLE001 - an override OmegaConf cannot apply (e.g. +key on a null node)
        raise ConfigError(f"the overrides {' '.join(overrides)} cannot be composed ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}); check their keys and values") from None


def hydra_message(e: BaseException) -> str:
    """Hydra's error with its hints ('Available options', 'use +key'), without OmegaConf's object_type lines."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    keep = [ln for ln in lines if not ln.startswith(("object_type=", "reference_type="))]
    cause = e.__cause__ or e.__context__
    if cause is not None and str(cause).strip() and str(cause).strip() not in str(e):
        keep += [ln.strip() for ln in str(cause).strip().splitlines()
                 if ln.strip() and not ln.strip().startswith(("object_type=", "reference_type="))]
    return " ".join(keep)


def validate(cfg: DictConfig):
    """The typed config (`mhalab.schema.TrainConfig`) of a composed one: every value and combination checked.

    `logger` and `callbacks` stay config nodes (their interpolations need the running job); their targets are
    checked by `mhalab.targets.check_config`.
    """
    from omegaconf.errors import OmegaConfBaseException

    from mhalab.schema import TrainConfig

    container = OmegaConf.to_container(cfg, resolve=False)
    container.pop("hydra", None)
    container["logger"], container["callbacks"] = {}, {}
    try:
        typed = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), container))
    except OmegaConfBaseException as e:
        raise ConfigError(hydra_message(e)) from None
    typed.logger, typed.callbacks = cfg.get("logger") or {}, cfg.get("callbacks") or {}
    typed.data = typed.data.resolved()
    return typed


def check_job(cfg: DictConfig):
    """Allow-list, schema and machine checks of one composed job config; returns its TrainConfig."""
    from mhalab.targets import check_config

    allowed = cfg.get("allowed_targets") or []
    check_config(cfg, list(allowed) if not isinstance(allowed, str) else [allowed])
    tc = validate(cfg)
    check_inputs(tc)
    check_machine(tc)
    return tc


def check_inputs(tc) -> None:
    """Files the run will read exist: data.path files (readable, not empty) and ckpt_path."""
    from mhalab.data.config import normalize_path

    if tc.data.path is not None:
        for split, files in normalize_path(tc.data.path).items():
            for f in files:
                if not os.path.isfile(f):
                    raise ConfigError(f"data.path file {f} does not exist")
                if os.path.getsize(f) == 0:
                    raise ConfigError(f"data.path file {f} is empty")
    if tc.ckpt_path is not None and not Path(tc.ckpt_path).is_file():
        raise ConfigError(f"ckpt_path={tc.ckpt_path}: no such checkpoint file")


def check_machine(tc) -> None:
    """The accelerator asked for exists, and the model fits in memory."""
    from mhalab.cost import memory_estimate

    if tc.trainer.wants_gpu:
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"trainer.accelerator={tc.trainer.accelerator}: no CUDA GPU is available to this "
                              f"torch {torch.__version__}; use trainer=cpu or trainer.accelerator=auto")
    need = memory_estimate(tc)
    have = _physical_memory()
    if have and need > have:
        raise ConfigError(f"the model needs about {need / 2**30:.1f} GiB (parameters, gradients, optimizer state and "
                          f"activations of one batch; mhalab.cost.memory_estimate) but this machine has "
                          f"{have / 2**30:.1f} GiB: lower attention.d_head, model sizes, data.max_len or "
                          "data.batch_size")


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_writable(directory: Path, key: str) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory):
            pass
    except OSError as e:
        raise ConfigError(f"{key}={directory} is not writable ({e.strerror or e}): set {key} "
                          "(or MHALAB_ROOT) to a writable directory") from None


# -- the jobs of a command -------------------------------------------------------------------------------------

@dataclass
class Plan:
    """What a command will run: the argv to hand to Hydra and each job's overrides and checked config."""

    argv: list[str]
    multirun: bool
    jobs: list[tuple[list[str], Any]]  # (overrides, TrainConfig)
    resume_dir: Path | None = None


def preflight(argv: list[str]) -> Plan | None:
    """Check everything a command would run before Hydra starts; None for Hydra's own informational flags."""
    args = parse_args(argv)
    if any(getattr(args, flag, None) for flag in HYDRA_FLAGS_WITHOUT_RUN):
        return None
    overrides = list(args.overrides)
    if args.multirun:
        return _preflight_multirun(argv, overrides, args.config_dir, args.config_name)
    cfg = compose(overrides, args.config_dir, args.config_name)
    tc = check_job(cfg)
    log_dir = Path(tc.paths.log_dir)
    check_writable(log_dir, "paths.log_dir")
    plan = Plan(list(argv), False, [(overrides, tc)])
    if tc.resume:
        if any(o.startswith("hydra.run.dir=") for o in overrides):
            raise ConfigError("resume with hydra.run.dir: give the run directory as resume=<run_dir> instead")
        plan.resume_dir = resume_target(tc, overrides, log_dir / tc.task_name / "runs")
        if plan.resume_dir is not None:
            plan.argv = plan.argv + [f"hydra.run.dir={plan.resume_dir}"]
    return plan


def _preflight_multirun(argv, overrides, config_dir, config_name) -> Plan:
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    parsed = parser.parse_overrides(overrides)
    base = compose([o.input_line for o in parsed if not o.is_sweep_override()], config_dir, config_name)
    sweeper = str(OmegaConf.select(base, "hydra.sweeper._target_", default=""))
    if not sweeper.endswith("BasicSweeper"):  # e.g. Optuna: its trials are drawn while it runs
        tc = check_job(base)
        check_writable(Path(tc.paths.log_dir), "paths.log_dir")
        if tc.resume:
            raise ConfigError(f"resume with the sweeper {sweeper}: only grid sweeps (the basic sweeper) resume")
        return Plan(list(argv), True, [(overrides, tc)])
    params = [f"{k}={v}" for k, v in (OmegaConf.select(base, "hydra.sweeper.params", default=None) or {}).items()]
    (batch,) = BasicSweeper.split_arguments(parser.parse_overrides(params + overrides), None)
    jobs = []
    for i, job in enumerate(batch):
        try:
            jobs.append((list(job), check_job(compose(list(job), config_dir, config_name))))
        except ConfigError as e:
            raise ConfigError(f"sweep job {i} ({' '.join(job)}): {e}") from None
    tc = jobs[0][1]
    check_writable(Path(tc.paths.log_dir), "paths.log_dir")
    plan = Plan(list(argv), True, jobs)
    if tc.resume:
        plan.resume_dir = resume_sweep(tc, [j for j, _ in jobs], overrides,
                                       Path(tc.paths.log_dir) / tc.task_name / "multiruns")
        plan.argv = plan.argv + [f"hydra.sweep.dir={plan.resume_dir}"]
    elif not any(o.startswith("hydra.sweep.dir=") for o in overrides):
        # resolved here, once: a launcher's worker processes would each make their own run id
        plan.argv = plan.argv + [f"hydra.sweep.dir={OmegaConf.select(base, 'hydra.sweep.dir')}"]
    return plan


# -- resuming ----------------------------------------------------------------------------------------------------

def run_overrides(run_dir: Path) -> list[str] | None:
    """A run's command-line overrides (from Hydra's .hydra/overrides.yaml), or None if unreadable."""
    import yaml

    try:
        found = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    return [str(o) for o in found] if isinstance(found, list) else None


# overrides that say where a run lives or how it is executed, never what it computes (results do not depend on
# data.num_workers: tests/test_resume.py)
NOT_DEFINING = ("resume=", "hydra.run.dir=", "hydra.sweep.dir=", "fault.", "hydra/launcher=", "hydra.launcher.",
                "paths.", "data.cache_dir=", "data.hf_cache_dir=", "data.num_workers=")


def defining(overrides: list[str]) -> list[str]:
    """The overrides that define what a run computes (NOT_DEFINING aside): a resumed run must have the same."""
    return sorted(o for o in overrides if not o.lstrip("+~").startswith(NOT_DEFINING))


def run_status(run_dir: Path) -> str | None:
    """The status in a run's summary.json ("ok", "failed", "interrupted"), or None without a readable one."""
    from mhalab.summary import read_summary

    if not (run_dir / SUMMARY).is_file():
        return None
    try:
        return read_summary(run_dir).status
    except ConfigError:
        return None


def resume_target(tc, overrides: list[str], runs_dir: Path) -> Path | None:
    """The run directory `resume` continues, checked; None when that run has finished (nothing to do)."""
    if tc.resume is True:
        same = [d for d in (runs_dir.iterdir() if runs_dir.is_dir() else [])
                if d.is_dir() and run_overrides(d) is not None and defining(run_overrides(d)) == defining(overrides)]
        unfinished = [d for d in same if run_status(d) != "ok"]
        if not unfinished:
            if same:
                raise Finished(max(same, key=lambda d: d.name))
            raise ConfigError(f"resume=true: no run under {runs_dir} has these overrides; run without resume, or "
                              "give resume=<run_dir>")
        run_dir = max(unfinished, key=lambda d: d.name)  # names start with the start time
    else:
        run_dir = Path(str(tc.resume)).expanduser().resolve()
        if not (run_dir / ".hydra" / "overrides.yaml").is_file():
            raise ConfigError(f"resume={tc.resume}: {run_dir} is not a run directory (no .hydra/overrides.yaml)")
        theirs = run_overrides(run_dir)
        if theirs is None or defining(theirs) != defining(overrides):
            raise ConfigError(f"resume={tc.resume}: that run was started with overrides {defining(theirs or [])}, "
                              f"not {defining(overrides)}; give the same overrides to resume it")
        if run_status(run_dir) == "ok":
            raise Finished(run_dir)
    check_unlocked(run_dir)
    return run_dir.resolve()


def resume_sweep(tc, jobs: list[list[str]], overrides: list[str], multiruns_dir: Path) -> Path:
    """The sweep directory a multirun `resume` continues: every job's directory there has that job's overrides."""
    def matches(sweep_dir: Path) -> bool:
        return all(run_overrides(sweep_dir / str(i)) in (None, job) or
                   defining(run_overrides(sweep_dir / str(i)) or []) == defining(job) for i, job in enumerate(jobs))

    if tc.resume is True:
        found = sorted((d for d in (multiruns_dir.iterdir() if multiruns_dir.is_dir() else [])
                        if d.is_dir() and any((d / str(i)).is_dir() for i in range(len(jobs))) and matches(d)),
                       key=lambda d: d.name)
        if not found:
            raise ConfigError(f"resume=true: no sweep under {multiruns_dir} has these jobs; run without resume, or "
                              "give resume=<sweep_dir>")
        sweep_dir = found[-1]
    else:
        sweep_dir = Path(str(tc.resume)).expanduser().resolve()
        if not sweep_dir.is_dir() or not matches(sweep_dir):
            raise ConfigError(f"resume={tc.resume}: the job folders there do not hold these jobs' overrides "
                              "(the sweep must be given exactly as it was started)")
    for i in range(len(jobs)):
        if (sweep_dir / str(i)).is_dir():
            check_unlocked(sweep_dir / str(i))
    return sweep_dir.resolve()


class Finished(Exception):
    """The run to resume has finished: nothing to do (not an error)."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        super().__init__(f"{run_dir} has finished (summary.json status ok); nothing to resume")


# -- locking -------------------------------------------------------------------------------------------------------

class RunLock:
    """An exclusive lock on a run directory (flock on <run_dir>/.lock), held while a process works in it and
    released by the kernel when the process dies, however it dies."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK
        self.fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
            os.close(fd)
            raise ConfigError(f"{self.path.parent} is in use by another process (pid {holder or '?'}); wait for it "
                              "or stop it before running there") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def check_unlocked(run_dir: Path) -> None:
    """ConfigError if another process holds the run directory's lock."""
    lock = RunLock(run_dir)
    if lock.path.exists():
        lock.acquire()
        lock.release()


def remove_stale_temporaries(run_dir: Path) -> list[Path]:
    """Temporary files an interrupted write left in a run directory (checkpoints, summary): removed, returned."""
    stale = [p for pattern in (".*.ckpt.*.tmp", f".{SUMMARY}.*.tmp", "checkpoints/.*.tmp")
             for p in Path(run_dir).glob(pattern) if p.is_file()]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale
