"""The plan of a command, made before it starts: the config of every job composed and checked, where each lives.

`preflight(argv)` runs before Hydra does anything: it composes the config of every job the command would run
(a multirun's sweep expanded), refuses any `_target_` outside the allow-list (`mhalab.targets`), builds the typed
config (`mhalab.config.schema`) so every value is checked, and settles `resume` (`mhalab.runs.identity`; run directories are locked by `mhalab.runs.rundir`). So a bad value, an unsafe target or a
wrong resume is one sentence and exit 2, with no run directory, no file written and no code run. It imports no
torch or Lightning, so it answers in about a second. What it composed is what runs: a single run starts from its
config (`Plan.config`, `mhalab.runs.launch`), a grid sweep's launcher takes each job's (`mhalab.runs.sweeper`).

Run directories: `<paths.log_dir>/<task_name>/runs/<run id>` (multiruns: `.../multiruns/<run id>/<job>`), the run
id being the time to the microsecond, the process id and random bits (`${mhalab.run_id:}`, one per process).
"""

from __future__ import annotations

import os
import secrets
import sys
import time
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mhalab.checks import available_cpus, check_path
from mhalab.errors import ConfigError
from mhalab import faults
from mhalab.runs.identity import check_not_a_run, identity, resume_sweep, resume_target
from mhalab.runs.rundir import check_unlocked
from mhalab.runs.stopping import stops_as_a_whole

CHECKING = "mhalab: checking the sweep's jobs before anything is written"  # a long sweep check's progress line
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
    """`${mhalab.cwd:}` (the current directory), `${mhalab.run_id:}` and `${mhalab.direction:metric}` for the
    configs; idempotent."""
    if not OmegaConf.has_resolver("mhalab.cwd"):
        OmegaConf.register_new_resolver("mhalab.cwd", os.getcwd)
    if not OmegaConf.has_resolver("mhalab.run_id"):
        OmegaConf.register_new_resolver("mhalab.run_id", run_id)
    if not OmegaConf.has_resolver("mhalab.direction"):
        OmegaConf.register_new_resolver("mhalab.direction", direction)


def direction(metric: str) -> str:
    """The sweeper's direction for an optimized metric: minimize losses and bits per byte, maximize the rest
    (`mhalab.stats.lower_is_better`, the one rule)."""
    from mhalab.stats import lower_is_better

    return "minimize" if lower_is_better(str(metric)) else "maximize"


# -- composing and checking ------------------------------------------------------------------------------------

def compose(overrides: list[str], config_dir: str | None = None, config_name: str | None = None) -> DictConfig:
    """The composed config (Hydra's node included) of a single run with these overrides, as `mhalab train` composes
    it (`mhalab.config.compose.Composer`)."""
    from argparse import Namespace

    from mhalab.config.compose import Composer

    register()
    register_resolvers()
    args = Namespace(config_dir=config_dir, config_name=config_name, config_path=None)
    with Composer(args) as composer:
        return composer.run_config(list(overrides))


def register() -> None:
    from mhalab.config.schema import register as register_schema

    register_schema()


def validate(cfg: DictConfig, plain: dict | None = None):
    """The typed config (`mhalab.config.schema.TrainConfig`) of a composed one: every value and combination checked.

    `plain`: the same config resolved (`mhalab.config.compose.resolved`); when the config was composed on the schema
    (its types already checked by OmegaConf), the dataclasses are built from it directly, in a millisecond.

    `logger` and `callbacks` stay config nodes (their interpolations need the running job); their targets are
    checked by `mhalab.targets.check_config`.
    """
    from omegaconf.errors import OmegaConfBaseException

    from mhalab.checks import check_finite
    from mhalab.config.compose import hydra_message
    from mhalab.config.schema import TrainConfig

    check_finite("", {k: v for k, v in (plain or OmegaConf.to_container(cfg, resolve=False)).items() if k != "hydra"})
    if plain is not None and OmegaConf.get_type(cfg) is TrainConfig:  # composed on the schema: types checked
        typed = _typed(TrainConfig, {k: v for k, v in plain.items() if k not in ("hydra", "logger", "callbacks")})
        typed.logger, typed.callbacks = cfg.get("logger") or {}, cfg.get("callbacks") or {}
        typed.data = typed.data.resolved()
        typed.check_metrics()
        return typed
    container = OmegaConf.to_container(cfg, resolve=False)
    container.pop("hydra", None)
    container["logger"], container["callbacks"] = {}, {}
    try:
        typed = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), container))
    except OmegaConfBaseException as e:
        raise ConfigError(hydra_message(e)) from None
    typed.logger, typed.callbacks = cfg.get("logger") or {}, cfg.get("callbacks") or {}
    typed.data = typed.data.resolved()
    typed.check_metrics()
    return typed


def _typed(cls, values: dict, prefix: str = ""):
    """A dataclass (nested ones too) built from plain values whose types OmegaConf has checked."""
    import dataclasses
    import typing

    from mhalab.checks import unknown_key

    hints = typing.get_type_hints(cls)
    unknown = sorted(set(values) - set(hints))
    if unknown:
        raise unknown_key(f"{prefix}{unknown[0]}", [f.name for f in dataclasses.fields(cls)])
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in values:
            continue
        value, kind = values[f.name], hints[f.name]
        options = [t for t in typing.get_args(kind) if t is not type(None)] if typing.get_origin(kind) is \
            typing.Union else [kind]
        if isinstance(value, dict) and len(options) == 1 and dataclasses.is_dataclass(options[0]):
            value = _typed(options[0], value, f"{prefix}{f.name}.")
        kwargs[f.name] = value
    return cls(**kwargs)


def check_job(cfg: DictConfig, run_dir: str | Path | None = None, files: tuple[str, ...] = (),
              cli: list[str] | tuple[str, ...] = ()):
    """Every check of one composed job config (Hydra's node included) that runs in `run_dir`: what may run
    (`mhalab.targets`), where it may write (`mhalab.config.writes`), what may send data off the machine
    (`mhalab.config.network`: only the command line's overrides `cli`), every value (`mhalab.config.schema`), its
    input files and the machine. `files`: the config files that set `allowed_targets`, to name them. Returns its
    TrainConfig (with `redaction`: `mhalab.config.secrets`)."""
    from mhalab.config.compose import resolved
    from mhalab.config.network import check_network
    from mhalab.config.secrets import Redaction
    from mhalab.targets import (check_config, check_launcher_text, check_logging, check_no_grant_in_config,
                                       check_resolved)
    from mhalab.config.writes import check_writes

    check_no_grant_in_config(cfg, list(files))
    check_config(cfg)
    run_dir = str(run_dir if run_dir is not None else OmegaConf.select(cfg, "hydra.run.dir"))
    plain = resolved(cfg, run_dir)
    check_resolved(plain)
    check_launcher_text(plain["hydra"].get("launcher"))
    for name in ("job_logging", "hydra_logging"):
        if plain["hydra"].get(name) is not None:
            check_logging(plain["hydra"][name], f"hydra.{name}")
    tc = validate(cfg, plain)  # first: a value that makes a bad path (task_name) is named itself
    check_path("hydra.run.dir" if run_dir == str(OmegaConf.select(cfg, "hydra.run.dir")) else "hydra.sweep.dir",
               run_dir)
    check_writes(plain, run_dir)
    check_network(plain, cli)
    check_inputs(tc)
    check_machine(tc)
    faults.settings()  # MHALAB_FAULTS, when set, is well formed
    tc.redaction = Redaction.of(cfg)
    tc.identity = identity(tc.redaction(plain))
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
    """The accelerator asked for exists, the processes asked for have CPUs, and the model fits in memory."""
    from mhalab.cost import memory_estimate

    if tc.trainer.wants_gpu:
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"trainer.accelerator={tc.trainer.accelerator}: no CUDA GPU is available to this "
                              f"torch {torch.__version__}; use trainer=cpu or trainer.accelerator=auto")
    cpus = available_cpus()
    if tc.data.num_workers > cpus:
        raise ConfigError(f"data.num_workers={tc.data.num_workers}: num_workers must be an integer in [0, {cpus}], "
                          "the CPUs this process may use")
    if tc.trainer.accelerator == "cpu" and isinstance(tc.trainer.devices, int) and tc.trainer.devices > cpus:
        raise ConfigError(f"trainer.devices={tc.trainer.devices} with trainer.accelerator=cpu: devices (one process "
                          f"each) must be -1, auto or an integer in [1, {cpus}], the CPUs this process may use")
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
    show_only: bool = False  # Hydra prints something (--cfg, --info, --hydra-help) and runs no job
    sweep_dir: Path | None = None  # a sweep that stops as a whole (`mhalab.runs.stopping.stops_as_a_whole`)
    config: Any = None  # a single run's config, composed and checked, for `mhalab.runs.launch` (not composed again)


def preflight(argv: list[str], task_function=None) -> Plan:
    """Check everything a command would run before Hydra starts, on the configs Hydra will compose.

    `--allow PKG` is taken out of argv and granted (`mhalab.targets.grant`); `task_function`: the function
    `hydra.main` will run (a relative -cp is found beside its module), `mhalab.training.train.run` when None."""
    from mhalab.config.compose import Composer, parse_args, shows_only, unset_job
    from mhalab.targets import grant, split_allow

    packages, argv = split_allow(list(argv))
    grant(packages)
    args = parse_args(argv)
    register()
    register_resolvers()
    overrides = list(args.overrides)
    composer = Composer(args, task_function)
    try:
        if shows_only(args):  # nothing runs, but what is composed must be safe to compose and print
            cfg = composer.run_config(overrides)
            from mhalab.targets import check_config, check_no_grant_in_config

            check_no_grant_in_config(cfg, composer.files_setting(cfg, "allowed_targets"))
            check_config(cfg)
            return Plan(argv, False, [], show_only=True)
        cfg = None if args.multirun else _single_run_config(composer, overrides)
        if cfg is None:
            return _preflight_multirun(composer, argv, overrides, args.multirun)
        run_dir = OmegaConf.select(cfg, "hydra.run.dir")
        tc = check_job(cfg, run_dir, _files(composer, cfg), overrides)
        check_unlocked(Path(run_dir))  # Hydra writes its bookkeeping there before any job code runs
        if not tc.resume:
            check_not_a_run(Path(run_dir), "hydra.run.dir")
        log_dir = Path(tc.paths.log_dir)
        check_writable(log_dir, "paths.log_dir")
        plan = Plan(list(argv), False, [(overrides, tc)], config=unset_job(cfg))
        if tc.resume:
            if any(o.startswith("hydra.run.dir=") for o in overrides):
                raise ConfigError("resume with hydra.run.dir: give the run directory as resume=<run_dir> instead")
            plan.resume_dir = resume_target(tc, log_dir / tc.task_name / "runs")
            if plan.resume_dir is not None:
                plan.argv = plan.argv + [f"hydra.run.dir={plan.resume_dir}"]
                plan.config = composer.run_config(overrides + [f"hydra.run.dir={plan.resume_dir}"])
        return plan
    finally:
        composer.close()


def _single_run_config(composer, overrides: list[str]) -> DictConfig | None:
    """The config of a run without -m, composed once; None when a config makes it a multirun (`hydra.mode`)."""
    from hydra.types import RunMode

    try:
        cfg = composer.run_config(overrides)
    except ConfigError:  # e.g. a sweep value, legal only when a config sets hydra.mode=MULTIRUN
        if composer.multirun(overrides):
            return None
        raise
    return None if OmegaConf.select(cfg, "hydra.mode") == RunMode.MULTIRUN else cfg


def check_n_jobs(master: DictConfig) -> None:
    """A launcher that runs jobs in processes on this machine (joblib's) starts no more of them than it has CPUs."""
    if "joblib" not in str(OmegaConf.select(master, "hydra.launcher._target_", default="")):
        return
    n_jobs, cpus = OmegaConf.select(master, "hydra.launcher.n_jobs", default=None), available_cpus()
    if n_jobs is not None and n_jobs != -1 and (isinstance(n_jobs, bool) or not isinstance(n_jobs, int)
                                                or not 1 <= n_jobs <= cpus):
        raise ConfigError(f"hydra.launcher.n_jobs={n_jobs!r}: n_jobs (worker processes) must be -1 (one per CPU) or "
                          f"an integer in [1, {cpus}], the CPUs this process may use")


def check_sweep_direction(master: DictConfig, metric: str) -> None:
    """A sweeper with a single direction (Optuna's) must go the way optimized_metric is better."""
    given = OmegaConf.select(master, "hydra.sweeper.direction", default=None)
    if isinstance(given, str) and given.lower() in ("minimize", "maximize") and given.lower() != direction(metric):
        raise ConfigError(f"hydra.sweeper.direction={given} with optimized_metric={metric}: {metric} is better "
                          f"when it is {'lower' if direction(metric) == 'minimize' else 'higher'}, so the direction "
                          f"must be {direction(metric)} (leave it out: hydra/sweeper=search derives it)")


def _files(composer, cfg) -> tuple[str, ...]:
    """The config files that set allowed_targets, only looked for when it is set."""
    return tuple(composer.files_setting(cfg, "allowed_targets")) if cfg.get("allowed_targets") else ()


def _preflight_multirun(composer, argv, overrides, multirun_flag: bool) -> Plan:
    """The sweep as Hydra will run it: the master config, then each job of the grid composed as its launcher will
    compose it, and handed on to the launcher (`mhalab.runs.sweeper.hand_on`), so that it is composed once."""
    from mhalab.config.compose import unset_job
    from mhalab.runs import sweeper as grid_sweeper
    from mhalab.runs.slurm import check_launcher

    grid_sweeper.forget()
    master = composer.sweep_config(overrides)
    sweep_dir = str(OmegaConf.select(master, "hydra.sweep.dir"))
    sweeper = str(OmegaConf.select(master, "hydra.sweeper._target_", default=""))
    if not grid_sweeper.is_grid(sweeper):  # e.g. Optuna: its trials are drawn while it runs
        tc = check_job(master, sweep_dir, _files(composer, master), overrides)
        if tc.resume:
            raise ConfigError(f"resume with the sweeper {sweeper}: only grid sweeps (the basic sweeper) resume")
        check_launcher(master, int(OmegaConf.select(master, "hydra.sweeper.n_jobs", default=1) or 1))
        check_sweep_direction(master, tc.optimized_metric)
        check_not_a_run(Path(sweep_dir), "hydra.sweep.dir")
        check_writable(Path(tc.paths.log_dir), "paths.log_dir")
        return Plan(list(argv), True, [(overrides, tc)])
    from mhalab.targets import check_config, check_no_grant_in_config

    check_no_grant_in_config(master, list(_files(composer, master)))
    check_config(master)  # the launcher and Hydra's callbacks, before any job
    grid_sweeper.check_batch_size(OmegaConf.select(master, "hydra.sweeper.max_batch_size", default=None))
    jobs = composer.sweep_jobs(master, overrides)
    given_dir = any(o.startswith("hydra.sweep.dir=") for o in overrides)
    hydra = composer.launch_overrides(overrides, None if given_dir else sweep_dir, multirun_flag)
    checked = []
    t0, said = time.perf_counter(), None
    for i, job in enumerate(jobs):
        now = time.perf_counter()
        if now - (said or t0) > (5 if said else 2):  # a long check is never silent (a short one: no line)
            said = now
            print(f"{CHECKING}: {i}/{len(jobs)} ({now - t0:.0f} s)", file=sys.stderr, flush=True)
        try:
            cfg = composer.job_config(hydra, job, i)
            job_dir = os.path.join(sweep_dir, str(OmegaConf.select(cfg, "hydra.sweep.subdir")))
            if Path(sweep_dir).resolve() not in Path(job_dir).resolve().parents:
                raise ConfigError(f"hydra.sweep.subdir={OmegaConf.select(cfg, 'hydra.sweep.subdir')!r}: a job's "
                                  f"folder must be inside the sweep directory {sweep_dir}")
            checked.append((job, check_job(cfg, job_dir, _files(composer, cfg), overrides)))
            check_unlocked(Path(job_dir))  # Hydra writes its bookkeeping there before any job code runs
            if grid_sweeper.takes_handed(sweeper):  # mhalab's: its launcher runs this very config
                grid_sweeper.hand_on(composer.config_name, hydra + list(job), unset_job(cfg))
        except ConfigError as e:
            raise ConfigError(f"sweep job {i} ({' '.join(job)}): {e}") from None
    tc = checked[0][1]
    if not tc.resume:
        check_not_a_run(Path(sweep_dir), "hydra.sweep.dir")
    check_n_jobs(master)
    check_launcher(master, len(checked))  # the cluster's own answer, before anything is written
    check_writable(Path(tc.paths.log_dir), "paths.log_dir")
    plan = Plan(list(argv), True, checked)
    if tc.resume:
        plan.resume_dir = resume_sweep(tc, [t for _, t in checked], Path(tc.paths.log_dir) / tc.task_name / "multiruns")
        plan.argv = plan.argv + [f"hydra.sweep.dir={plan.resume_dir}"]
        grid_sweeper.forget()  # composed for another directory: the sweeper composes each job (once) for this one
    elif not given_dir:
        # resolved here, once: a launcher's worker processes would each make their own run id
        plan.argv = plan.argv + [f"hydra.sweep.dir={sweep_dir}"]
    if stops_as_a_whole(master.hydra):
        plan.sweep_dir = Path(plan.resume_dir or sweep_dir).resolve()
    return plan
