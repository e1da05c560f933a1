"""Every Lightning callback mhalab adds to a run.

- `HeadStatsCallback`: per-head attention statistics on a fixed probe batch while training; importance and pictures
  at the end (configured by the `stats` node, `_target_` in conf/callbacks/default.yaml). Definitions of every
  statistic: docs/definitions.md#per-head-statistics.
- `ProgressLog`: a log line every n steps when there is no progress bar to watch (files, nohup, SLURM).
- `LastCheckpoint`: `checkpoints/last.ckpt` at every checkpoint event, every n steps and on demand.
- `StepSeed`: every random draw of a training step comes from (seed, step), never from what ran before.
- `GracefulStop`: a stop signal (`mhalab.runs.stopping`) stops training at the next step boundary with a checkpoint.
- `FaultInjection`: deliberate crashes for the recovery tests.
"""

from __future__ import annotations

import logging
import math
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Checkpoint
from torch import Tensor

from mhalab.training.lightning_private import validation_due
from mhalab import faults
from mhalab import head_statistics as S
from mhalab.errors import ConfigError
from mhalab.heads import head_label
from mhalab.runs.rundir import LAST
from mhalab.config.schema import StatsConfig
from mhalab.runs.stopping import SIGNALS, Interrupted
from mhalab.training.console import HEARTBEAT, StepEta, duration

log = logging.getLogger("mhalab")


class HeadStatsCallback(L.Callback):
    """Statistics of every head on the datamodule's probe batch: every `every_n_steps` optimizer steps and at each
    validation end (one extra no-grad pass, its cache of hook points filled through the math path; training keeps
    its backend), logged as `attn/L{l}H{h}/{stat}`, `attn/L{l}/{stat}_mean` and the GQA group similarity
    `attn/L{l}/within_group_jsd` / `between_group_jsd`. Besides the built-in statistics: TransformerLens's head
    detector scores on random tokens repeated once (`stats.detector_len`), and your own (`stats.extra`, see
    `mhalab.head_statistics.HeadStatistic`). At the end of training: importance (Michel et al. 2019) on
    validation batches and the pictures in <run_dir>/plots, also sent to the loggers as images. A failure there is
    logged and recorded in `summary()`, never fatal.
    """

    def __init__(self, stats: StatsConfig | dict | None = None):
        self.cfg = stats if isinstance(stats, StatsConfig) else StatsConfig(**(stats or {}))
        self.user_stats = dict(self.cfg.extra)  # name -> HeadStatistic (instantiated by Hydra from its _target_)
        for name, stat in self.user_stats.items():
            if name in S.STAT_NAMES + S.DETECTOR_NAMES:
                raise ConfigError(f"stats.extra.{name}: a built-in statistic has that name; choose another")
            if not callable(stat):
                raise ConfigError(f"stats.extra.{name}: not a statistic object; name its class by _target_")
        self.probe: dict[str, Tensor] | None = None
        self.detector_probe: Tensor | None = None  # (B, 2 * detector_len) repeated random tokens
        self.decode = None  # ids -> token strings, for plot tick labels
        self.plot_dir: Path | None = None
        self.stats: dict[str, Tensor] = {}  # latest {stat: (n_layers, n_heads)}
        self.groups: dict[str, Tensor] = {}  # latest {"within_group_jsd" | "between_group_jsd": (n_layers,)}
        self.attentions: list[Tensor] = []  # latest probe weights, n_layers x (B, H, T, T)
        self.importance: Tensor | None = None  # (n_layers, n_heads)
        self.plot_paths: list[Path] = []
        self._next = 0  # the first step whose statistics pass sends pictures to the loggers
        self.errors: list[str] = []
        self.measured_step: int | None = None  # the step of the latest measurement

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.probe is None and trainer.datamodule is not None:
            self.probe = trainer.datamodule.probe_batch(self.cfg.probe_size)
            self.decode = trainer.datamodule.decode
        self.plot_dir = Path(trainer.default_root_dir) / "plots"

    @torch.no_grad()
    def measure(self, pl_module) -> tuple[dict[str, Tensor], dict[str, Tensor], list[Tensor]]:
        """(stats {stat: (L, H)}, groups {key: (L,)}, weights per layer) of the probe batch, in the parameters'
        dtype: an autocast around the call (a mixed-precision run) is turned off for it (`float32_pass`)."""
        from mhalab.training.evaluation import float32_pass

        with float32_pass(pl_module):
            return self._measure(pl_module)

    def _measure(self, pl_module) -> tuple[dict[str, Tensor], dict[str, Tensor], list[Tensor]]:
        batch = pl_module.to_device(self.probe)
        points = {"pattern"} | {p for stat in self.user_stats.values() for p in getattr(stat, "points", ("pattern",))}
        cache = S.probe_cache(pl_module, batch, points)
        attentions = [cache["pattern", layer] for layer in range(cache.n_layers)]  # n_layers x (B, H, T, T)
        stats, groups = S.layer_stats(attentions, batch.get("padding_mask"), pl_module.arch.causal,
                                      pl_module.arch.attention.n_kv_heads)
        shape = tuple(stats[S.STAT_NAMES[0]].shape)
        for name, stat in self.user_stats.items():
            value = torch.as_tensor(stat(cache, batch)).detach().float().cpu()
            if tuple(value.shape) != shape:
                raise ValueError(f"stats.extra.{name} returned shape {tuple(value.shape)}, expected (n_layers, "
                                 f"n_heads) = {shape}")
            stats[name] = value
        if self.cfg.detector_len:
            ids = self._detector_probe(pl_module).to(pl_module.device)  # (B, 2 * detector_len)
            stats.update(S.detector_scores(S.attention_patterns(pl_module, {"input_ids": ids}), ids))
        return stats, groups, attentions

    def _detector_probe(self, pl_module) -> Tensor:
        """Random tokens repeated once, drawn from the probe batch's tokens (its first position, a [CLS] in a
        classifier, and padding left out), fixed for the run."""
        if self.detector_probe is None:
            ids, pad = self.probe["input_ids"][:, 1:], self.probe.get("padding_mask")
            pool = (ids[~pad[:, 1:]] if pad is not None else ids.flatten()).unique()
            half = min(self.cfg.detector_len, pl_module.arch.model.max_len // 2)
            self.detector_probe = S.repeated_random_tokens(pool, self.cfg.probe_size, half, seed=0)
        return self.detector_probe

    def update(self, pl_module) -> None:
        self.stats, self.groups, self.attentions = self.measure(pl_module)
        self.measured_step = pl_module.global_step
        metrics = {}
        for stat, values in self.stats.items():  # (L, H)
            for layer, row in enumerate(values.tolist()):
                metrics.update({f"attn/{head_label(layer, h)}/{stat}": v for h, v in enumerate(row)})
                metrics[f"attn/L{layer}/{stat}_mean"] = sum(row) / len(row)
        for key, values in self.groups.items():  # (L,)
            metrics.update({f"attn/L{layer}/{key}": v for layer, v in enumerate(values.tolist())
                            if not math.isnan(v)})
        for logger in pl_module.loggers:
            logger.log_metrics(metrics, step=pl_module.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.cfg.enabled and trainer.global_step % self.cfg.every_n_steps == 0 and trainer.is_global_zero:
            self.update(pl_module)
            self.log_pictures(trainer, pl_module)

    def on_validation_end(self, trainer, pl_module) -> None:
        if self.cfg.enabled and not trainer.sanity_checking and trainer.is_global_zero and trainer.state.fn == "fit":
            self.update(pl_module)
            self.log_pictures(trainer, pl_module)

    def log_pictures(self, trainer, pl_module) -> None:
        """The attention maps and a few heatmaps of this statistics pass, to the loggers that take images, so heads
        can be watched forming: at most `stats.picture_passes` passes a run, spread over its steps, each picture at
        most pictures.LOGGED_WIDTH pixels wide. Never fatal."""
        step, total = trainer.global_step, trainer.estimated_stepping_batches
        if not (self.cfg.plots and self.cfg.picture_passes and image_loggers(pl_module.loggers)) or step < self._next:
            return
        spacing = max(self.cfg.every_n_steps, int(total // self.cfg.picture_passes) if math.isfinite(total) else 0)
        self._next = step + spacing

        def draw() -> None:
            from mhalab import pictures

            maps, tokens = self.probe_maps()
            images = pictures.training_pictures(self.stats, maps, tokens, self.cfg.max_plot_tokens,
                                                pl_module.arch.attention.n_kv_heads)
            log_images(pl_module.loggers, images, step)

        try:  # during training: not an end-of-run extra (no heartbeat phase), and a failure never stops the run
            draw()
        except Exception as e:  # noqa: BLE001
            message = f"pictures while training failed: {type(e).__name__}: {e}"
            log.error("head statistics: %s (the run goes on)", message)
            self.errors.append(message)

    def finish(self, trainer, pl_module) -> None:
        """The end-of-training extras: a last measurement, importance and pictures (called by
        mhalab.training.train once the final weights are known)."""
        if not (self.cfg.enabled and trainer.is_global_zero):
            return
        if self.measured_step != pl_module.global_step:  # else measured on these weights already
            self._guarded("statistics", lambda: self.update(pl_module))
        if self.cfg.importance:
            self._guarded("importance", lambda: self._importance(trainer, pl_module), self.cfg.importance_batches)
        if self.cfg.plots:
            self._guarded("plots", lambda: self.draw(pl_module))

    def _guarded(self, what: str, fn, total: int | None = None) -> None:
        """Run one extra as a phase of the console's heartbeat; a stop signal stops the run (it stays resumable:
        `resume` computes the extras), any other failure is recorded."""
        try:
            _stop_if_requested()
            with HEARTBEAT.phase(f"end of run: {what}", total):
                fn()
            _stop_if_requested()  # the signal's exception may have been swallowed (e.g. by a logging handler)
        except Interrupted:
            raise
        except Exception as e:  # noqa: BLE001 - an extra must never lose the run's results
            message = f"{what} failed: {type(e).__name__}: {e}"
            log.error("head statistics: %s (the run's metrics are kept)", message)
            self.errors.append(message)

    def _importance(self, trainer, pl_module) -> None:
        from mhalab.training.evaluation import importance

        batches = []
        for batch in trainer.datamodule.val_dataloader():
            batches.append(batch)
            if len(batches) >= self.cfg.importance_batches:
                break
        self.importance = importance(pl_module, HEARTBEAT.ticking(batches or [self.probe]))

    def draw(self, pl_module) -> None:
        from matplotlib.image import imread

        from mhalab import pictures
        from mhalab.attention_page import write_attention_page

        self.plot_dir.mkdir(parents=True, exist_ok=True)
        matrices = dict(self.stats)
        if self.importance is not None:
            matrices["importance"] = self.importance
        arch = pl_module.arch
        paths = pictures.plot_stat_heatmaps(matrices, self.plot_dir, pictures.drawn_stats(matrices, arch.causal))
        maps, tokens = self.probe_maps()
        paths.append(pictures.plot_attention_maps(maps, tokens, self.plot_dir / "attention_maps.png",
                                                  self.cfg.max_plot_tokens, n_kv_heads=arch.attention.n_kv_heads))
        shown = {k: matrices[k] for k in pictures.drawn_stats(matrices, arch.causal)}  # none zero by construction
        paths.append(write_attention_page(self.plot_dir / "attention.html", maps, tokens, shown, "attention of "
                                          f"every head: {self.plot_dir.parent.name}", arch.attention.n_kv_heads))
        self.plot_paths = paths
        log_images(pl_module.loggers, {p.stem: (imread(p)[..., :3] * 255).astype("uint8") for p in paths
                                       if p.suffix == ".png"}, pl_module.global_step)

    def probe_maps(self) -> tuple[list[Tensor], list[str]]:
        """(the latest attention weights of the first probe example, n_layers x (H, T, T) on the CPU, its T tokens),
        padding left out."""
        ids, pad = self.probe["input_ids"][0], self.probe.get("padding_mask")
        n_valid = int((~pad[0]).sum()) if pad is not None else ids.numel()
        tokens = self.decode(ids[:n_valid].tolist()) if self.decode else [str(i) for i in ids[:n_valid].tolist()]
        return [w[0, :, :n_valid, :n_valid].float().cpu() for w in self.attentions], tokens

    def summary(self) -> dict[str, Any]:
        """This callback's part of summary.json: (L, H) matrices as nested lists, plot paths, errors."""
        return {
            "head_stats": {k: v.tolist() for k, v in self.stats.items()},
            "head_importance": self.importance.tolist() if self.importance is not None else None,
            "kv_groups": {k: v.tolist() for k, v in self.groups.items()},
            "plots": [str(p) for p in self.plot_paths],
            "extras_errors": list(self.errors),
        }


def _stop_if_requested() -> None:
    if SIGNALS.received is not None:
        raise Interrupted(SIGNALS.received)


def image_loggers(loggers) -> list:
    """The loggers that take images: wandb's (and MLFlow's) `log_image`, TensorBoard's `add_image`."""
    return [lg for lg in loggers if hasattr(lg, "log_image") or hasattr(getattr(lg, "experiment", None), "add_image")]


def log_images(loggers, images: dict, step: int) -> None:
    """Pictures {name: (height, width, 3) uint8 array} to every logger that takes images, under `attn/<name>` (one
    key per picture: their sizes differ), at `step`."""
    for logger in image_loggers(loggers):
        for name, image in images.items():
            if hasattr(logger, "log_image"):  # WandbLogger, MLFlow, ...
                logger.log_image(key=f"attn/{name}", images=[image], step=step)
            else:  # TensorBoardLogger's SummaryWriter
                logger.experiment.add_image(f"attn/{name}", image, step, dataformats="HWC")


class ProgressLog(L.Callback):
    """One line every `every_n_steps` optimizer steps (step, epoch, loss, tokens/s, ETA from the recent steps) and
    one per validation (the closing one too), to the `mhalab` logger (stdout and <run_dir>/train.log) — the view of
    a run whose output is not a terminal. Training, validation and test are phases of `console.HEARTBEAT`: a line
    at least every `heartbeat_s` seconds while each runs."""

    def __init__(self, every_n_steps: int = 50, heartbeat_s: float = 30.0):
        self.every_n_steps = every_n_steps
        HEARTBEAT.interval = heartbeat_s
        self._t0 = self._tokens0 = self._step0 = self._val_t0 = self._seen_step = 0
        self._eta = StepEta()
        self._phases: list = []

    def _enter(self, trainer, what: str, total=None, line=None, quiet: bool = False, key=None) -> None:
        if trainer.is_global_zero:
            phase = HEARTBEAT.phase(what, total, line, quiet, key)
            phase.__enter__()
            self._phases.append(phase)

    def _exit(self) -> None:
        if self._phases:
            self._phases.pop().__exit__(None, None, None)

    def on_train_start(self, trainer, pl_module) -> None:
        self._t0, self._tokens0, self._step0 = time.perf_counter(), pl_module.tokens_seen, trainer.global_step
        self._eta, self._seen_step = StepEta(), trainer.global_step
        self._eta.step(self._t0, 0)
        self._enter(trainer, "training", line=lambda: self._line(trainer, pl_module), quiet=True,
                    key=lambda: trainer.global_step)

    def on_train_end(self, trainer, pl_module) -> None:
        self._exit()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step != self._seen_step:  # an optimizer step ended (several batches each when accumulating)
            self._eta.step(time.perf_counter(), step - self._seen_step)
            self._seen_step = step
        first = step == self._step0 + 1  # the first step's line says at once that training runs
        if not trainer.is_global_zero or (step % self.every_n_steps and not first) or step == self._step0:
            return
        HEARTBEAT.once(step, lambda: self._line(trainer, pl_module))  # unless the heartbeat said this step already

    def _line(self, trainer, pl_module) -> str:
        step = trainer.global_step
        elapsed = time.perf_counter() - self._t0
        rate = (pl_module.tokens_seen - self._tokens0) / max(elapsed, 1e-9)
        total = trainer.estimated_stepping_batches
        eta = self._eta.eta(total - step) if math.isfinite(total) else float("nan")
        loss = getattr(pl_module, "_last_loss", None)  # the latest step's, which train/loss logs when written
        return (f"step {step}/{int(total) if math.isfinite(total) else '?'} | epoch {trainer.current_epoch} | "
                f"train/loss {f'{float(loss):.4f}' if loss is not None else '-'} | {rate:.0f} tokens/s | "
                f"ETA {duration(eta)}")

    def on_validation_start(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self._val_t0 = time.perf_counter()
            closing = " (closing)" if trainer.state.fn == "validate" else ""
            self._enter(trainer, f"validation{closing} at step {trainer.global_step}", _count(trainer.num_val_batches))

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if not trainer.sanity_checking:
            HEARTBEAT.tick()

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        self._exit()
        if trainer.state.fn == "fit":
            self._eta.paused(time.perf_counter() - self._val_t0)
        if trainer.is_global_zero and trainer.state.fn in ("fit", "validate"):
            shown = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
            log.info("step %d | %s", trainer.global_step, " | ".join(f"{k} {v:.4f}" for k, v in sorted(shown.items())))
            HEARTBEAT.printed()

    def on_test_start(self, trainer, pl_module) -> None:
        self._enter(trainer, "test", _count(trainer.num_test_batches))

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        HEARTBEAT.tick()

    def on_test_end(self, trainer, pl_module) -> None:
        self._exit()

    def on_exception(self, trainer, pl_module, exception) -> None:
        while self._phases:
            self._exit()


def _count(batches: list) -> int | None:
    """The batches of all of an evaluation's dataloaders, None when one has no length."""
    total = sum(batches)
    return int(total) if math.isfinite(total) else None


class LastCheckpoint(Checkpoint):
    """Writes <run_dir>/checkpoints/last.ckpt at every validation end of training, every `every_n_steps` optimizer
    steps (if set; not at a step a validation follows, see `validation_due`) and whenever `save(trainer)` is called
    (end of training, a stop signal). Subclassing `Checkpoint` makes Lightning call it after the best-model
    checkpoint, so last.ckpt holds that one's state too."""

    def __init__(self, run_dir: str | Path, every_n_steps: int | None = None):
        self.path = Path(run_dir) / LAST
        self.every_n_steps = every_n_steps

    def save(self, trainer) -> None:
        trainer.save_checkpoint(self.path, weights_only=False)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.every_n_steps and trainer.global_step % self.every_n_steps == 0 and not validation_due(trainer):
            self.save(trainer)

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self.save(trainer)


def seed_all(seed: int) -> None:
    """Seed python, numpy and torch from one integer. On a machine with no accelerator torch's CPU generator is the
    only one: seeded directly, since `torch.manual_seed` would also queue a lazy CUDA/XPU seeding (with a stack
    capture) every call."""
    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    if _has_accelerator():
        torch.manual_seed(seed)
    else:
        torch.default_generator.manual_seed(seed)


def _has_accelerator() -> bool:
    global _ACCELERATOR
    if _ACCELERATOR is None:
        xpu = getattr(torch, "xpu", None)
        _ACCELERATOR = bool(torch.cuda.is_available() or torch.backends.mps.is_available()
                            or (xpu is not None and xpu.is_available()))
    return _ACCELERATOR


_ACCELERATOR: bool | None = None


class StepSeed(L.Callback):
    """Reseed python, numpy and torch (dropout) from (seed, step, rank) before every training step, so that no
    step's randomness depends on what ran before it in this process (data loading, statistics, a restart)."""

    def __init__(self, seed: int):
        self.seed = seed

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        seed_all(self.seed * 100_003 + 7919 * (trainer.global_step + 1) + trainer.global_rank)


class GracefulStop(Checkpoint):
    """Stops a run cleanly on a stop signal (`mhalab.runs.stopping`) or when its sweep is stopped (`sweep_dir`): during
    training at the next step boundary, or at the end of the validation that follows it, after `LastCheckpoint` saved
    the state (a `Checkpoint` placed after it, Lightning calls this last); outside training (data preparation, test)
    at once. `Interrupted` carries the exit status. `install()` around the whole run; Lightning replaces signal
    handlers when fitting starts, so they are installed again at `on_train_start`."""

    def __init__(self, last: LastCheckpoint, sweep_dir: Path | None = None):
        self.last, self.sweep_dir = last, sweep_dir
        self.owns = False  # installed the process's handler itself (train called outside `mhalab train`)

    def install(self) -> None:
        self.owns = SIGNALS.install() or self.owns
        SIGNALS.now = True

    def uninstall(self) -> None:
        SIGNALS.now = SIGNALS.training = False
        if self.owns:
            SIGNALS.uninstall()
            self.owns = False

    def previous(self, signum: int):
        """The handler that was installed before mhalab's for `signum` (e.g. submitit's requeue handler)."""
        return SIGNALS.original(signum)

    def check(self) -> None:
        """Raise Interrupted if a stop was requested."""
        signum = SIGNALS.requested(self.sweep_dir)
        if signum is not None:
            raise Interrupted(signum)

    def on_train_start(self, trainer, pl_module) -> None:
        SIGNALS.install()
        SIGNALS.now, SIGNALS.training = False, True
        self.check()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if SIGNALS.requested(self.sweep_dir) is not None and not validation_due(trainer):
            self.last.save(trainer)
            self.check()

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self.check()  # LastCheckpoint has saved this state already

    def on_train_end(self, trainer, pl_module) -> None:
        SIGNALS.now, SIGNALS.training = True, False


class FaultInjection(L.Callback):
    """Deliberate failures for testing recovery, added only when MHALAB_FAULTS is set (`mhalab.faults`).

    kill_at_step: SIGKILL this process before optimizer step N (a crash mid-epoch, nothing flushed).
    nan_at_step: fill one weight with NaN before step N, so the loss turns NaN through the real code path.
    kill_at: SIGKILL at a named point (`mhalab.faults.point`), read from MHALAB_FAULTS by the faults module.
    """

    def __init__(self, kill_at_step: int | None = None, nan_at_step: int | None = None, kill_at: str | None = None):
        self.kill_at_step, self.nan_at_step = kill_at_step, nan_at_step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        step = trainer.global_step
        if self.kill_at_step is not None and step == self.kill_at_step:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.nan_at_step is not None and step == self.nan_at_step:
            with torch.no_grad():
                next(pl_module.parameters()).fill_(float("nan"))

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            faults.point("validation")

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        faults.point("test")
