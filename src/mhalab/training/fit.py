"""A checked job trained: from its TrainConfig to <run_dir>/summary.json, and what a failure leaves behind.

`train` is the failure protocol (a stop signal, a NaN loss, a full disk, wandb, a bug: a checkpoint where there is
one, an "interrupted" or "failed" summary, and the exit the job makes: `Stop`); `_fit` the happy path (data, model,
Lightning's fit, a last validation, the end-of-training extras, the test, the summary). The rest builds what the
Trainer is given (loggers, callbacks, its arguments, the best checkpoint) and records the run's environment.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import platform
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from mhalab import faults
from mhalab.checks import available_cpus
from mhalab.errors import ConfigError
from mhalab.relative_path import relative
from mhalab.runs import slurm, stopping
from mhalab.runs.rundir import LAST, launcher_rank, remove_stale_temporaries
from mhalab.runs.summary import RunSummary, cpu_name, write_summary
from mhalab.training.console import check_sizes, header, quiet_lightning, warn_if_repeating

log = logging.getLogger("mhalab")


class Stop(Exception):
    """A run that ended early; its summary is written and `exit_code` says how (`signum` when a signal stopped it,
    `note` the line that says how to resume)."""

    def __init__(self, exit_code: int, signum: int | None = None, note: str | None = None):
        self.exit_code, self.signum, self.note = exit_code, signum, note


@dataclasses.dataclass
class _Job:
    """What the failure protocol needs of a job in progress (`train`, `_fit`)."""

    tc: Any
    run_dir: Path
    base: RunSummary  # the summary so far: status, config, environment, then architecture, cost ...
    last: Any  # LastCheckpoint
    stop: Any  # GracefulStop
    fault: Any  # FaultInjection, only when MHALAB_FAULTS is set (mhalab.faults)
    t_start: float
    trainer: Any = None  # the Lightning Trainer, once built


def train(tc, run_dir: Path, overrides: list[str], sweep_dir: Path | None = None) -> RunSummary:
    """Everything after validation; returns the summary, also written to run_dir/summary.json. `sweep_dir`: the
    sweep this job stops with (`mhalab.runs.stopping`). The work is `_fit`; here is what a stop signal, a NaN loss,
    a full disk or a bug leaves behind (a checkpoint, an "interrupted" or "failed" summary) and the exit it makes."""
    if launcher_rank() == 0:  # seconds pass before the header: say so at once
        log.info("mhalab: config checked; loading torch and Lightning, then the data")
        if tc.redaction.marks:
            log.info("mhalab: values from the environment (oc.env) are redacted in this run's files and loggers: %s",
                     ", ".join(tc.redaction.keys()))
    import torch

    from mhalab.training.callbacks import FaultInjection, GracefulStop, LastCheckpoint

    quiet_lightning()
    t_start = time.perf_counter()
    if launcher_rank() == 0:
        remove_stale_temporaries(run_dir)
    last = LastCheckpoint(run_dir, tc.checkpoint.every_n_steps)
    stop = GracefulStop(last, sweep_dir)
    wanted = faults.settings()
    fault = FaultInjection(**wanted) if wanted else None
    torch.set_num_threads(tc.torch_threads or job_threads())  # before the environment is recorded
    base = RunSummary(status="ok", task=tc.data.task, objective=tc.data.objective, overrides=overrides,
                      config=tc.redaction(_plain(tc)), environment=_environment(tc.trainer.precision))
    job = _Job(tc, run_dir, base, last, stop, fault, t_start)
    try:
        stop.install()  # from here a signal stops the run at once, or at a step boundary while training
        stop.check()  # one during start-up (imports, Hydra) was recorded: stop before anything else
        return _fit(job)
    except stopping.Interrupted as e:
        previous = stop.previous(e.signum)
        stop.uninstall()  # no second interruption while the summary is written
        step = job.trainer.global_step if job.trainer is not None else 0
        _write_failure(run_dir, base, job.trainer, "interrupted", "signal", f"{e} at step {step}")
        resume = shlex.join(["mhalab", "train", *(o for o in overrides if not o.startswith("resume=")),
                             f"resume={run_dir}"])
        saved = f"the last checkpoint is {run_dir / LAST}; " if (run_dir / LAST).is_file() else ""
        slurm.requeue(e.signum, previous)
        raise Stop(e.exit_code, e.signum, f"mhalab: {e} at step {step}; {saved}resume with:\n  {resume}") from None
    except FloatingPointError as e:
        print(f"error: training stopped: {e}; the last good checkpoint is kept in {run_dir / 'checkpoints'}",
              file=sys.stderr)
        _write_failure(run_dir, base, job.trainer, "failed", "nan", str(e))
        raise Stop(1) from None
    except ConfigError:
        raise
    except WandbError as e:
        print(f"error: {e}", file=sys.stderr)
        _write_failure(run_dir, base, job.trainer, "failed", "wandb", str(e))
        raise Stop(1) from None
    except OSError as e:  # disk full, unwritable directory, file too large
        from mhalab.data.cache import CacheWriteError

        advice = "" if isinstance(e, CacheWriteError) else ("; free space or set paths.log_dir to a writable "
                                                             "directory with room")
        print(f"error: could not write {e.filename or 'a file'} ({e.strerror or e}){advice}", file=sys.stderr)
        try:
            _write_failure(run_dir, base, job.trainer, "failed", "os", f"{e.filename}: {e.strerror or e}")
        except OSError:
            pass
        raise Stop(1) from None
    except Exception as e:  # a bug: record it beside whatever the run got to, then show the traceback
        _write_failure(run_dir, base, job.trainer, "failed", "error", f"{type(e).__name__}: {e}")
        raise
    finally:
        stop.uninstall()


def _fit(job: _Job) -> RunSummary:
    """The happy path: data, model, fit, a last validation, the end-of-training extras, test, summary.json."""
    import lightning as L
    import torch

    from mhalab.cost import model_cost, precision_bytes
    from mhalab.data import build_datamodule
    from mhalab.training.callbacks import StepSeed
    from mhalab.training.checkpoint import AtomicCheckpointIO, resume_from
    from mhalab.training.module import AttentionLitModule, without_nan_fill

    tc, run_dir, base, last, stop, fault, t_start = (job.tc, job.run_dir, job.base, job.last, job.stop, job.fault,
                                                     job.t_start)
    L.seed_everything(tc.seed, workers=True, verbose=False)
    dm = build_datamodule(tc.data, seed=tc.seed)
    dm.prepare_data()
    dm.setup("fit")
    check_sizes(tc, dm)  # the trainer's settings against the data's batches, before the Trainer is built
    arch = tc.architecture(dm.vocab_size, dm.objective, dm.n_classes)
    token_bytes = dm.token_bytes.tolist() if dm.token_bytes is not None else None
    module = AttentionLitModule(arch.to_dict(), dataclasses.asdict(tc.optim), token_bytes,
                                dataclasses.asdict(tc.endpoint))
    if tc.optimized_metric == "val/bpb" and not module.reports_bpb:
        raise ConfigError(f"optimized_metric=val/bpb: task {dm.task} ({dm.objective}) reports no bits per byte; "
                          "optimise val/loss, val/acc, val/acc_best or train/loss")
    if tc.model.compile:
        _check_compiler(tc)
        module.compile_training(tc.model.compile_backend)
    cost = model_cost(arch, dm.max_len, precision_bytes(tc.trainer.precision))
    base.task, base.architecture, base.cost, base.label_names = dm.task, arch.to_dict(), cost, dm.label_names
    base.baselines = dm.reference_levels()
    if launcher_rank() == 0:
        log.info(header(dm, arch, cost, run_dir))
        warn_if_repeating(tc, dm)

    ckpt_path = str(tc.ckpt_path) if tc.ckpt_path else None
    if (tc.resume or slurm.requeued()) and (run_dir / LAST).is_file():
        ckpt_path = str(resume_from(run_dir))  # a damaged last.ckpt: one sentence, exit 2, the summary kept
        log.info("resuming from %s", ckpt_path)
    loggers, callbacks = build_loggers_and_callbacks(tc, run_dir, resuming=ckpt_path == str(run_dir / LAST))
    best = _best_checkpoint(tc, run_dir)
    callbacks += [best, last, StepSeed(tc.seed), stop] + ([fault] if fault is not None else [])
    trainer = job.trainer = L.Trainer(**_trainer_kwargs(tc), default_root_dir=str(run_dir), callbacks=callbacks,
                                      logger=loggers or False, plugins=[AtomicCheckpointIO()],
                                      profiler=_profiler(tc, run_dir))
    _start_wandb(loggers)
    # the run's hyperparameters and then the module's, written once: Lightning would log the module's again at fit,
    # validate and test, each time rewriting hparams.yaml (OmegaConf.save of the whole config, ~0.1 s a call)
    module._log_hyperparams = False
    hparams = {"config": base.config, "architecture": base.architecture, "cost": cost, **module.hparams_initial}
    for logger in loggers:
        logger.log_hyperparams(hparams)
    if tc.train:
        with without_nan_fill(trainer):
            trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path, weights_only=True)
    stop.check()
    if module.last_val_step != trainer.global_step:  # every finished run ends validated
        trainer.validate(module, datamodule=dm, verbose=False)
    last.save(trainer)
    # the run's own state, before testing loads the best checkpoint (and with it that checkpoint's state)
    fit_s, final_metrics = module.fit_s, dict(module.final_metrics)
    tokens_seen = int(trainer.strategy.reduce(torch.tensor(float(module.tokens_seen)), reduce_op="sum"))
    history, threshold_step = {k: list(v) for k, v in module.history.items()}, module.threshold_step
    extras = {}
    for cb in trainer.callbacks:
        if hasattr(cb, "finish"):
            cb.finish(trainer, module)
            extras.update(cb.summary())
    stop.check()  # a signal during the extras stops here at the latest: `resume` computes them
    t_test = time.perf_counter()
    test_metrics: dict[str, float] = {}
    test_ckpt = _test_checkpoint(best, module, tc, last.path)
    if tc.test:  # last.ckpt holds the weights in memory: tested as they are, not read back from disk
        in_memory = test_ckpt == last.path
        results = trainer.test(module, datamodule=dm, ckpt_path=None if in_memory else str(test_ckpt),
                               weights_only=True, verbose=False)
        test_metrics = {k: float(v) for k, v in (results[0] if results else {}).items()}
    summary = dataclasses.replace(
        base, metrics=final_metrics, test_metrics=test_metrics,
        timings={"fit_s": fit_s, "test_s": time.perf_counter() - t_test, "total_s": time.perf_counter() - t_start,
                 "train_steps": trainer.global_step, "epochs": trainer.current_epoch,
                 "tokens_seen": tokens_seen, "tokens_per_s": tokens_seen / fit_s if fit_s > 0 else None},
        checkpoints={"best": relative(test_ckpt, run_dir), "last": relative(last.path, run_dir)},
        head_stats=extras.get("head_stats", {}), head_importance=extras.get("head_importance"),
        kv_groups=extras.get("kv_groups", {}), plots=[relative(p, run_dir) for p in extras.get("plots", [])],
        extras_errors=extras.get("extras_errors", []), history=history,
        endpoint={**dataclasses.asdict(tc.endpoint), "threshold_step": threshold_step,
                  "stopped_early": tc.endpoint.stop_at_threshold and threshold_step == trainer.global_step})
    if trainer.is_global_zero:
        write_summary(run_dir, summary)
    faults.point("after_summary")
    return summary


def build_loggers_and_callbacks(tc, run_dir: Path, resuming: bool) -> tuple[list, list]:
    """The configured loggers and callbacks (targets checked by the preflight); a resumed run continues its wandb
    run and keeps the CSV written before the interruption; no progress bar without a terminal."""
    from hydra.utils import instantiate

    from mhalab.config.network import NETWORK_KEYS, environment_wins, no_telemetry

    logger_cfg = OmegaConf.create(environment_wins(tc.redaction(
        OmegaConf.to_container(tc.logger, resolve=True), ("logger",), keep=NETWORK_KEYS))) if tc.logger else {}
    no_telemetry(OmegaConf.to_container(logger_cfg) if tc.logger else {})
    if resuming and "wandb" in logger_cfg and wandb_run_id(run_dir):
        logger_cfg.wandb.id = wandb_run_id(run_dir)
        logger_cfg.wandb.resume = "allow"
    if "csv" in logger_cfg and any((run_dir / "csv").glob("*")):  # keep what an earlier attempt wrote
        logger_cfg.csv.version = f"resumed-{len(list(run_dir.glob('csv/resumed-*'))) + 1}"
    loggers = [instantiate(node) for node in logger_cfg.values() if node is not None]
    show_bar = tc.trainer.enable_progress_bar and sys.stdout.isatty()
    callbacks = []
    for name, node in (tc.callbacks or {}).items():
        if node is None or (name == "rich_progress_bar" and not show_bar):
            continue
        if name == "progress_log" and show_bar:
            continue
        callbacks.append(instantiate(node, _convert_="object"))
    return loggers, callbacks


def _check_compiler(tc) -> None:
    """model.compile with inductor on the CPU generates C++: without a compiler, one sentence before training."""
    import shutil

    import torch

    on_gpu = tc.trainer.accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available()
    if tc.model.compile_backend == "inductor" and not on_gpu and not (
            shutil.which(os.environ.get("CXX", "g++")) or shutil.which("clang++")):
        raise ConfigError("model.compile=true with model.compile_backend=inductor needs a C++ compiler on the CPU "
                          "(g++ or clang++, or $CXX) and none was found; install one, or set "
                          "model.compile_backend=aot_eager or model.compile=false")


def _trainer_kwargs(tc) -> dict[str, Any]:
    kwargs = dataclasses.asdict(tc.trainer)
    kwargs.pop("profiler")
    kwargs["enable_progress_bar"] = tc.trainer.enable_progress_bar and sys.stdout.isatty()
    if (tc.trainer.max_steps != -1 and tc.trainer.min_epochs == 1) or tc.endpoint.stop_at_threshold:
        kwargs["min_epochs"] = None  # a step cap below one epoch is a cap, not a wish; a stop at the threshold too
    t = tc.trainer
    if t.max_steps != -1 or (t.check_val_every_n_epoch is None and isinstance(t.val_check_interval, int)):
        # a validation follows within a known number of steps (every val_check_interval steps, or the closing one
        # at max_steps): it checks what the sanity check would, so the job does not pay for both
        kwargs["num_sanity_val_steps"] = 0
    return kwargs


def _profiler(tc, run_dir: Path):
    """trainer.profiler by name, its report saved in the run directory."""
    if tc.trainer.profiler is None:
        return None
    from lightning.pytorch import profilers

    cls = {"simple": profilers.SimpleProfiler, "advanced": profilers.AdvancedProfiler,
           "pytorch": profilers.PyTorchProfiler}[tc.trainer.profiler]
    return cls(dirpath=str(run_dir), filename="profile")


def _best_checkpoint(tc, run_dir: Path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    return ModelCheckpoint(dirpath=str(run_dir / "checkpoints"), filename="best-epoch{epoch:03d}-step{step:06d}",
                           monitor=tc.checkpoint.monitor, mode=tc.checkpoint.mode, save_top_k=1, save_last=False,
                           auto_insert_metric_name=False, save_on_train_epoch_end=False)


def _test_checkpoint(best, module, tc, last_path: Path) -> Path:
    """The checkpoint to test: the best by the monitored metric, or the final state when it is at least as good."""
    import torch

    final = module.final_metrics.get(tc.checkpoint.monitor)
    if not best.best_model_path or best.best_model_score is None:
        return last_path
    score = float(best.best_model_score)
    if final is not None:  # compared at the precision the score is kept in (a tie is the final state itself)
        final = float(torch.tensor(final, dtype=best.best_model_score.dtype))
    if final is not None and (final <= score if tc.checkpoint.mode == "min" else final >= score):
        return last_path
    return Path(best.best_model_path)


def wandb_run_id(run_dir: Path) -> str | None:
    """The id of the wandb run (offline or online) already in run_dir/wandb, to continue it."""
    runs = sorted((run_dir / "wandb").glob("*run-*"), key=lambda p: p.stat().st_mtime)
    return runs[-1].name.rsplit("-", 1)[-1] if runs else None


def _write_failure(run_dir: Path, base: RunSummary, trainer, status: str, kind: str, message: str) -> None:
    if trainer is not None and not trainer.is_global_zero:
        return
    module = trainer.lightning_module if trainer is not None else None
    steps = trainer.global_step if trainer is not None else 0
    write_summary(run_dir, dataclasses.replace(
        base, status=status, error={"kind": kind, "message": message},
        metrics=dict(module.final_metrics) if module is not None else {},
        timings={"train_steps": steps}, checkpoints={"last": relative(run_dir / LAST, run_dir)
                                                     if (run_dir / LAST).is_file() else None}))


def _plain(tc) -> dict:
    """The training config as plain data (logger and callback nodes resolved)."""
    out = dataclasses.asdict(dataclasses.replace(tc, logger={}, callbacks={}))
    out["logger"] = OmegaConf.to_container(tc.logger, resolve=True) if tc.logger else {}
    out["callbacks"] = OmegaConf.to_container(tc.callbacks, resolve=True) if tc.callbacks else {}
    return out


def job_threads() -> int:
    """The CPUs this job was given: SLURM's allocation (SLURM_CPUS_PER_TASK), else the CPU affinity mask, shared
    among the jobs a local launcher runs at once (hydra/launcher=parallel: n_jobs), at least 1."""
    cpus = os.environ.get("SLURM_CPUS_PER_TASK")
    n = int(cpus) if cpus and cpus.isdigit() else available_cpus()
    try:
        from hydra.core.hydra_config import HydraConfig

        launcher = HydraConfig.get().launcher
        jobs = int(launcher.get("n_jobs") or 1) if "joblib" in str(launcher.get("_target_", "")) else 1
    except Exception:  # noqa: BLE001 - not inside a Hydra job (tests, notebooks)
        jobs = 1
    if jobs < 0:  # joblib's -1: as many jobs as CPUs
        jobs = n
    return max(1, n // max(1, jobs))


KERNEL_CAPS = ("MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
#   settings that cap or pin the kernels MKL and oneDNN choose for this CPU (recorded in lower case, None unset)


def _environment(precision: str) -> dict[str, Any]:
    """What the numerics depend on: versions, the CPU (processor: its family, model and vector instructions) and its
    kernels (cpu_capability, ATEN_CPU_CAPABILITY), the BLAS and oneDNN path (blas, lapack, mkldnn, torch_config, the
    KERNEL_CAPS set), threads (parallel_info), the trainer's precision and the scheduler."""
    import lightning as L
    import torch

    build = torch.__config__.show()
    setting = lambda key: next(iter(re.findall(rf"\b{key}=([^,\s]+)", build)), None)  # noqa: E731
    return {"torch": torch.__version__, "lightning": L.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "processor": cpu_name(), "cpu_count": os.cpu_count(),
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "torch_threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
            "precision": str(precision),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # the CPU kernels: results differ across them
            "aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY"),  # a cap on them, if set
            "mkldnn": bool(torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled),
            "blas": setting("BLAS_INFO"), "lapack": setting("LAPACK_INFO"),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "mkl_num_threads": os.environ.get("MKL_NUM_THREADS"),
            **{key.lower(): os.environ.get(key) for key in KERNEL_CAPS},
            "torch_config": build, "parallel_info": torch.__config__.parallel_info(),
            "slurm_job": os.environ.get("SLURM_JOB_ID"), "slurm_cpus_per_task": os.environ.get("SLURM_CPUS_PER_TASK")}


class WandbError(Exception):
    """wandb could not start or end its run (a network, login or settings error): one sentence, exit status 1."""


WANDB_ADVICE = ("check logger.wandb.mode and its settings (base_url, api_key) and the network, or keep the run on "
                "this machine with logger.wandb.mode=offline or WANDB_MODE=offline")


def _start_wandb(loggers: list) -> None:
    """Start each wandb logger's run now, so that a failure is one sentence naming wandb (not a traceback, and not
    a disk's advice for a refused connection)."""
    for logger in loggers:
        if "wandb" in type(logger).__module__.lower() or "wandb" in type(logger).__name__.lower():
            logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)  # wandb's telemetry export, online
            try:
                logger.experiment
            except Exception as e:  # noqa: BLE001 - wandb raises many kinds, OSError among them
                first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                raise WandbError(f"wandb could not start its run ({type(e).__name__}: {first[:200]}); "
                                 f"{WANDB_ADVICE}") from None


def finish_wandb() -> None:
    """Close any wandb run (also after an error, and between multirun jobs); a failure is one line."""
    if "wandb" in sys.modules:
        import wandb

        if wandb.run is not None:
            try:
                wandb.finish()
            except Exception as e:  # noqa: BLE001 - the run's own results are written already
                print(f"error: wandb could not finish its run ({type(e).__name__}); {WANDB_ADVICE}", file=sys.stderr)

