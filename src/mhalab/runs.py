"""Runs that survive: pre-flight checks, resuming a killed run, atomic checkpoints, per-epoch seeding.

- `preflight(argv)`: before Hydra creates a run directory, compose the config, validate it and check that the log
  directory is writable, so a bad value or an unwritable disk gives one sentence and no directory.
- `find_resumable(...)`: `resume=true` picks the newest run of the same task with the same overrides that has a
  `checkpoints/last.ckpt`; `resume=<run_dir>` names it. Training continues there from that checkpoint.
- `AtomicCheckpointIO`: checkpoints go to a temporary file, are fsynced, then renamed over the target, so a kill
  at any moment leaves either the old or the new `last.ckpt`, never half of one.
- `StepSeed`: reseeds every RNG before each step from (seed, step), and `EpochShuffleSampler` shuffles (and MLM
  masks) by (seed, epoch), so no step depends on what ran before it in the same process: a run resumed
  from an end-of-epoch checkpoint ends with exactly the metrics of a run never interrupted (CPU, same seed).
"""

from __future__ import annotations

import io
import os
import random
import tempfile
from pathlib import Path
from typing import Any, Iterator

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch import Callback
from torch.utils.data import Sampler

from mhalab.errors import ConfigError

LAST = Path("checkpoints") / "last.ckpt"


class AtomicCheckpointIO(TorchCheckpointIO):
    """torch.save to a temporary file in the same directory, fsync, then os.replace onto the target."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            buffer = io.BytesIO()
            torch.save(checkpoint, buffer)  # serialise first: a failed write then raises OSError, not torch's own
            with os.fdopen(fd, "wb") as f:
                f.write(buffer.getbuffer())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def load_checkpoint(self, path, map_location: Any | None = None, weights_only: bool | None = None):
        return super().load_checkpoint(path, map_location=map_location, weights_only=True)


class EpochShuffleSampler(Sampler[int]):
    """A random permutation per epoch drawn from (seed, epoch) alone; Lightning calls set_epoch each epoch."""

    def __init__(self, n: int, seed: int, on_set_epoch=None):
        self.n, self.seed, self.epoch = n, seed, 0
        self.on_set_epoch = on_set_epoch  # e.g. the MLM collator, whose masks follow the epoch too

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if self.on_set_epoch is not None:
            self.on_set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())

    def __len__(self) -> int:
        return self.n


def seed_all(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:
        pass


class StepSeed(Callback):
    """Reseed python, numpy and torch (dropout) from (seed, step, rank) before every training step, so no step's
    randomness depends on what ran before it in this process (data loading, statistics, a restart)."""

    def __init__(self, seed: int):
        self.seed = seed

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        seed_all(self.seed * 100_003 + 7919 * (trainer.global_step + 1) + trainer.global_rank)


def _overrides_of(run_dir: Path) -> list[str] | None:
    import yaml

    f = run_dir / ".hydra" / "overrides.yaml"
    try:
        return list(yaml.safe_load(f.read_text()) or [])
    except (OSError, yaml.YAMLError):
        return None


def _without_resume(overrides: list[str]) -> list[str]:
    """Overrides that define a run: resume, the run dir and fault injection aside."""
    return sorted(o for o in overrides if not o.lstrip("+~").startswith(("resume=", "hydra.run.dir=", "fault.")))


def find_resumable(runs_dir: Path, overrides: list[str]) -> Path | None:
    """The newest run under runs_dir with the same overrides (resume aside) and a checkpoints/last.ckpt."""
    if not runs_dir.is_dir():
        return None
    wanted = _without_resume(overrides)
    candidates = [d for d in runs_dir.iterdir() if (d / LAST).is_file() and _overrides_of(d) is not None
                  and _without_resume(_overrides_of(d)) == wanted]
    return max(candidates, key=lambda d: (d / LAST).stat().st_mtime, default=None)


def wandb_run_id(run_dir: Path) -> str | None:
    """The id of the wandb run (offline or online) already in run_dir/wandb, to resume it."""
    runs = sorted((run_dir / "wandb").glob("*run-*"), key=lambda p: p.stat().st_mtime)
    return runs[-1].name.rsplit("-", 1)[-1] if runs else None


def check_writable(directory: Path, key: str) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory):
            pass
    except OSError as e:
        raise ConfigError(f"{key}={directory} is not writable ({e.strerror or e}): set {key} "
                          "(or MHALAB_ROOT) to a writable directory") from None


def preflight(argv: list[str], conf_dir: str) -> list[str]:
    """Validate a single run's overrides before Hydra starts; returns argv, extended by hydra.run.dir on resume.

    Multiruns and Hydra's own flags are left to Hydra (each job is validated as it starts).
    """
    if any(a.startswith("-") for a in argv):
        return argv
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from mhalab.config import validate

    try:
        with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
            cfg = compose("train", overrides=argv)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(str(e).strip().splitlines()[0]) from None
    validate(cfg)
    log_dir = Path(cfg.paths.log_dir)
    check_writable(log_dir, "paths.log_dir")
    resume = cfg.get("resume")
    if not resume or any(a.startswith("hydra.run.dir=") for a in argv):
        return argv
    if resume is True:
        run_dir = find_resumable(log_dir / cfg.task_name / "runs", argv)
        if run_dir is None:
            raise ConfigError(f"resume=true: no run under {log_dir / cfg.task_name / 'runs'} has these overrides and "
                              "a checkpoints/last.ckpt; run without resume, or give resume=<run_dir>")
    else:
        run_dir = Path(str(resume))
        if not (run_dir / LAST).is_file():
            raise ConfigError(f"resume={resume}: {run_dir / LAST} does not exist; give the directory of a run that "
                              "wrote checkpoints")
    return argv + [f"hydra.run.dir={run_dir.resolve()}"]


class FaultInjection(Callback):
    """Deliberate failures for testing recovery (config group `fault`, all null by default).

    kill_at_step: SIGKILL this process before optimizer step N (a crash mid-epoch, nothing flushed).
    nan_at_step: fill one weight with NaN before step N, so the loss turns NaN through the real code path.
    """

    def __init__(self, kill_at_step: int | None = None, nan_at_step: int | None = None):
        self.kill_at_step, self.nan_at_step = kill_at_step, nan_at_step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        step = trainer.global_step
        if self.kill_at_step is not None and step == self.kill_at_step:
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        if self.nan_at_step is not None and step == self.nan_at_step:
            with torch.no_grad():
                next(pl_module.parameters()).fill_(float("nan"))
