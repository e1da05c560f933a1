"""Training: `mhalab train [overrides]` (also `python -m mhalab train`, `mhalab-train`).

Composes conf/train.yaml (in the package; add your own folder with --config-dir), checks every job before anything
is written (`mhalab.runs.preflight.preflight`), then runs each job (`run`: its run directory's lock, its config
checked again, `mhalab.training.fit.train`: the data, the model, Lightning's fit, the closing validation, the test of
the best checkpoint and <run_dir>/summary.json, `mhalab.runs.summary.RunSummary`).

Exit status: 0 on success (and when asked to resume a run that has finished); 2 for a config or input error (one
sentence on stderr, no run directory left behind); 1 when training fails (a NaN loss, a full disk: summary.json
then says "failed" and why); 128 + the signal when stopped by SIGINT (130), SIGTERM (143) or SIGUSR1/2, after a
checkpoint and an "interrupted" summary, with the command that resumes the run (`mhalab.runs.stopping`; also during
start-up). In a multirun a failing job records its failure in its own summary.json and the sweep goes on; a grid
sweep on this machine stops as a whole, with one line and the command that resumes the sweep.
"""

from __future__ import annotations

import gc
import logging
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from mhalab.config.compose import parse_args
from mhalab.config.schema import register
from mhalab.errors import ConfigError
from mhalab.runs import stopping
from mhalab.runs.identity import Finished, run_identity, run_status
from mhalab.runs.launch import launch
from mhalab.runs.preflight import new_command, preflight, register_resolvers, validate
from mhalab.runs.rundir import RunLock, launcher_rank
from mhalab.runs.summary import RunSummary, read_summary, write_summary
from mhalab.training.console import result_line, unfinished_twin, usage
from mhalab.training.fit import Stop, finish_wandb, train

log = logging.getLogger("mhalab")
CONFIG_PATH = "pkg://mhalab.conf"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    # What the imports made (torch, Lightning, Hydra: ~430,000 objects) lives as long as the process: frozen, the
    # collector no longer walks it at every full collection that composing configs triggers (the first composition
    # took 0.33 s of CPU, 0.17 s frozen; `mhalab bench startup`).
    gc.freeze()
    register()
    register_resolvers()
    new_command()
    if "--help" in argv or "-h" in argv:
        print(usage(argv))
        return
    try:
        plan = preflight(argv, run)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except Finished as f:
        print(f"mhalab: {f}")
        print(result_line(read_summary(f.run_dir), f.run_dir))
        sys.exit(0)
    twin = unfinished_twin(plan, argv)
    if twin:
        print(twin, file=sys.stderr)
    handled = not plan.show_only and (not plan.multirun or plan.sweep_dir is not None)
    if handled:  # else Hydra's own handling: a SLURM or Optuna sweep's parent stops as before
        stopping.SIGNALS.start_command(plan.sweep_dir)
    sys.argv = [sys.argv[0]] + plan.argv
    try:
        if plan.config is not None:  # a single run: its checked config, not composed twice more by hydra.main
            launch(parse_args(plan.argv), plan.config, run)
        else:
            hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="train")(run)()
    except KeyboardInterrupt:  # a worker that had not begun its job yet (joblib hands its KeyboardInterrupt on)
        if plan.sweep_dir is None or stopping.stopped(plan.sweep_dir) is None:
            raise
    finally:
        if handled:
            stopping.SIGNALS.uninstall()
    signum = stopping.stopped(plan.sweep_dir) if plan.sweep_dir is not None else None
    if signum is not None:
        began = any(run_identity(d) for d in plan.sweep_dir.iterdir() if d.is_dir())
        print(stopping.sweep_stopped(argv, plan.sweep_dir, signum, began), file=sys.stderr)
        sys.exit(128 + signum)


def run(cfg: DictConfig) -> float | None:
    """One Hydra job: train, summarise, and turn every failure into a summary and an exit status."""
    try:
        return _run(cfg)
    finally:
        stopping.SIGNALS.end_job()  # a parallel sweep's worker whose command is gone exits here


def _run(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    overrides = OmegaConf.to_container(hc.overrides.task)  # as typed: `${oc.env:...}` not resolved
    sweep_dir = Path(hc.runtime.cwd, hc.sweep.dir) if multirun and stopping.stops_as_a_whole(hc) else None
    if not stopping.SIGNALS.job_begins(sweep_dir):
        _leave_unstarted(run_dir)  # the sweep was stopped before this job began: resuming it runs the job
        return None
    if sweep_dir is not None and launcher_rank() == 0:
        stopping.announce_job(hc)  # a parallel sweep's launch line, when its job actually starts
    lock = RunLock(run_dir)
    if launcher_rank() == 0:  # DDP's other processes work in rank 0's run directory, under its lock
        try:
            lock.acquire()
        except ConfigError as e:  # another process works there: its directory is left as it is
            who = f"job {hc.job.num} of the sweep" if multirun else "the run"
            print(f"error: {who} did not start: {e}", file=sys.stderr)
            if multirun:
                return None
            sys.exit(2)
    try:
        tc = _check_running_job(cfg, hc, run_dir)
        if multirun and run_status(run_dir) == "ok":  # a resumed sweep: this job finished before
            done = read_summary(run_dir)
            log.info("job %s finished before: %s", run_dir, result_line(done, run_dir))
            return done.metrics.get(tc.optimized_metric)
        summary = train(tc, run_dir, overrides, sweep_dir)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        if multirun:  # keep the job's directory so the sweep report lists it as failed
            _fail(run_dir, overrides, "config", str(e))
            return None
        if _looks_empty(run_dir):
            lock.release()
            _remove_run_dir(run_dir)
        sys.exit(2)
    except Stop as e:
        if e.signum is not None and sweep_dir is not None:  # the sweep stops as a whole and says how to resume it
            stopping.mark_stopped(sweep_dir, e.signum)
            return None
        if e.note:
            print(e.note, file=sys.stderr)
        if multirun and e.exit_code == 1:
            return None
        sys.exit(e.exit_code)
    finally:
        lock.release()
        finish_wandb()
    if launcher_rank() == 0:
        log.info(result_line(summary, run_dir))  # to stdout and train.log, once under DDP
    return summary.metrics.get(tc.optimized_metric)  # what a sweeper (Optuna) optimises


def _check_running_job(cfg: DictConfig, hc, run_dir: Path):
    """The preflight's checks again on the config Hydra gave this job (what mhalab instantiates, where it writes,
    every value), then record what the run computes for `resume` to match on. Returns its TrainConfig."""
    from mhalab.runs.identity import identity, write_identity
    from mhalab.config.secrets import Redaction
    from mhalab.targets import check_config, check_resolved
    from mhalab.config.writes import check_writes

    check_config(cfg)
    plain = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    check_resolved({k: v for k, v in plain.items() if k != "hydra"})
    plain["hydra"] = {"job": {"chdir": bool(hc.job.chdir)}}  # Hydra's own nodes were used before the job began
    check_writes(plain, run_dir)
    tc = validate(cfg, plain)
    tc.redaction = Redaction.of(cfg)  # values from the environment: real in memory, redacted in files and loggers
    if launcher_rank() == 0:
        write_identity(run_dir, tc.redaction(plain))
    tc.identity = identity(tc.redaction(plain))
    return tc


def _fail(run_dir: Path, overrides: list[str], kind: str, message: str) -> None:
    write_summary(run_dir, RunSummary(status="failed", overrides=overrides, error={"kind": kind, "message": message}))


def _leave_unstarted(run_dir: Path) -> None:
    """A job that does not start leaves no folder behind (Hydra made it with its bookkeeping only), unless another
    process works there."""
    lock = RunLock(run_dir)
    try:
        lock.acquire()
    except ConfigError:
        return
    try:
        if _looks_empty(run_dir):
            _remove_run_dir(run_dir)
    finally:
        lock.release()


def _looks_empty(run_dir: Path) -> bool:
    """Only Hydra's bookkeeping (.hydra/, the job log, the lock) and nothing a run produced."""
    return run_dir.is_dir() and all(p.name in (".hydra", ".lock") or p.suffix == ".log" for p in run_dir.iterdir())


def _remove_run_dir(run_dir: Path) -> None:
    import shutil

    shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
