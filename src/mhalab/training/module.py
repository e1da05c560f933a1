"""The LightningModule: one model (classifier or LM), AdamW with warm-up and cosine decay, and the metrics of
`mhalab.training.evaluation`.

Logged: train/loss (per step), train/acc, val/loss, val/acc, val/acc_best, test/loss, test/acc; for text language
modelling also val/bpb and test/bpb (bits per UTF-8 byte of the predicted tokens).
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any

import lightning as L
import torch
from torch import Tensor
from torchmetrics import MaxMetric, Metric

from mhalab.training.lightning_private import logs_due, restart_training_iterator, validation_due
from mhalab.training.evaluation import batch_correct, batch_sums, mean_cross_entropy, metrics_from_sums
from mhalab.stats import lower_is_better
from mhalab.model import build_model
from mhalab.architecture import Architecture
from mhalab.config.schema import clips_under_amp


def lr_lambda(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """Linear warm-up to 1, then cosine decay to min_lr_ratio at total_steps."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def loss_read_after_batch(trainer) -> bool:
    """Whether anything reads the step's train/loss from Lightning after the current training batch: its loggers
    write (`log_every_n_steps`, or a stop), a validation follows (checkpoint and early-stopping callbacks read its
    metrics there), the epoch or training ends, or a progress bar shows it. `ProgressLog` reads the module's own."""
    loop = trainer.fit_loop
    return (trainer.progress_bar_callback is not None or trainer.should_stop or logs_due(trainer)
            or loop.epoch_loop.batch_progress.is_last_batch or 0 < trainer.max_steps <= trainer.global_step
            or validation_due(trainer))


@contextlib.contextmanager
def without_nan_fill(trainer):
    """Training on the CPU with `trainer.deterministic` on, without torch's NaN fill of every new tensor
    (`torch.utils.deterministic.fill_uninitialized_memory`: a guard against reading uninitialized memory, hundreds of
    fills a step). torch documents that a program that reads none stays deterministic without it; a run's figures
    are the same bit for bit (tests/training/test_step_pace.py). The setting is restored afterwards."""
    fills = torch.utils.deterministic.fill_uninitialized_memory
    if trainer.strategy.root_device.type == "cpu" and torch.are_deterministic_algorithms_enabled():
        torch.utils.deterministic.fill_uninitialized_memory = False
    try:
        yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = fills


def adamw_kwargs(fused: bool | None, params, amp_clips: bool = False) -> dict[str, Any]:
    """The implementation keyword of torch.optim.AdamW for `optim.fused` and where the parameters are: None (auto)
    gives {"fused": True} when every parameter is a floating-point tensor on a CUDA device and Lightning does not
    clip gradients under mixed precision (amp_clips, `config.schema.clips_under_amp`: it refuses a fused AdamW
    there), and {} (torch's default, foreach) otherwise; True and False are passed on as they are (torch refuses
    fused where it has no kernel; the config refuses fused=true where Lightning would)."""
    if fused is not None:
        return {"fused": bool(fused)}
    params = list(params)
    on_cuda = bool(params) and all(p.device.type == "cuda" and p.is_floating_point() for p in params)
    return {"fused": True} if on_cuda and not amp_clips else {}


class EvalSums(Metric):
    """The running (nats, correct, count, bytes) of `mhalab.training.evaluation.batch_sums`, summed across processes."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("sums", default=torch.zeros(4, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, sums: Tensor) -> None:
        self.sums += sums.to(self.sums)

    def compute(self) -> Tensor:
        return self.sums


class AttentionLitModule(L.LightningModule):
    """Trains `build_model(Architecture.from_dict(arch))`.

    Args:
        arch: the resolved architecture as a dict (`Architecture.to_dict()`; kept in the checkpoint).
        optim: `OptimConfig` fields as a dict.
        token_bytes: (vocab_size,) UTF-8 bytes of each token, for bits per byte; None when the tokens are not text
            (then no bpb is reported).
        endpoint: `EndpointConfig` fields as a dict: the metric whose threshold step is recorded, and whether the
            run stops there.
    """

    def __init__(self, arch: dict, optim: dict, token_bytes: list[int] | None = None, endpoint: dict | None = None):
        super().__init__()
        self.save_hyperparameters()
        self.arch = Architecture.from_dict(arch)
        self.model = build_model(self.arch)
        self.is_lm = self.arch.objective != "classification"
        self.reports_bpb = self.is_lm and token_bytes is not None
        self.register_buffer("token_bytes", torch.tensor(token_bytes) if self.reports_bpb else None,
                             persistent=False)
        self.train_sums = EvalSums()
        self.val_sums, self.test_sums = EvalSums(), EvalSums()
        self.val_acc_best = MaxMetric()
        self.val_acc_best.persistent(True)  # saved in checkpoints, so a resumed run keeps its best
        # run state kept in checkpoints (`on_save_checkpoint`), so a resumed run reports what an uninterrupted one does
        self.tokens_seen = 0  # input tokens (padding included) through training steps
        self.fit_s = 0.0  # seconds of training before this process (the training loop adds its own)
        self.last_val_step = -1  # the optimizer step of the latest validation during training
        self.final_metrics: dict[str, float] = {}  # train/loss of the last step, val/* of the latest validation
        self.history: dict[str, list[float]] = {"step": []}  # every validation during training: step and val/*
        self.threshold_step: int | None = None  # the first validated step whose endpoint metric reached threshold

    def attention_layers(self):
        return self.model.attention_layers()

    def to_device(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        return {k: v.to(self.device) for k, v in batch.items()}

    def forward(self, batch: dict[str, Tensor]):
        return self.model(batch["input_ids"], batch.get("padding_mask"))

    def compile_training(self, backend: str = "inductor") -> None:
        """torch.compile the model's forward pass for training steps only (`model.compile`): validation, testing,
        statistics and importance (which attach hooks) run the eager model. The compiled function is kept outside
        the module's children, so parameters, state_dict keys and checkpoints are those of the eager model."""
        self.__dict__["_compiled_forward"] = torch.compile(self.model.forward, backend=backend)

    def logits_and_labels(self, batch: dict[str, Tensor], training: bool = False) -> tuple[Tensor, Tensor]:
        """logits flattened to (N, C) and targets (N,), -100 where nothing is predicted. `training`: through the
        compiled forward pass when there is one (`compile_training`)."""
        compiled = self.__dict__.get("_compiled_forward") if training else None
        out = compiled(batch["input_ids"], batch.get("padding_mask")) if compiled is not None else self(batch)
        logits, labels = out.logits, batch["labels"]
        if self.is_lm:
            return logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)  # (B*T, V), (B*T,)
        return logits, labels  # (B, n_classes), (B,)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        logits, labels = self.logits_and_labels(batch, training=True)
        loss = mean_cross_entropy(logits, labels)
        value = loss.item()  # one read of the loss: the check, and train/loss below
        if not math.isfinite(value):
            raise FloatingPointError(f"loss is {value} at step {self.global_step}")
        self.tokens_seen += batch["input_ids"].numel()
        self._last_loss = loss.detach()
        # train/acc needs no second loss; `update`, not the metric's call, which also computes the batch's own value
        self.train_sums.update(batch_correct(logits.detach(), labels))
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        # the step's loss as a tensor, handed to Lightning (0.5-1 ms a call) only after the batches where something
        # reads it: there its loggers, callbacks and progress bar see what a call at every step gives them
        if getattr(self, "_last_loss", None) is not None and loss_read_after_batch(self.trainer):
            self.log("train/loss", self._last_loss, on_step=True, on_epoch=False, prog_bar=True)

    def on_train_epoch_end(self) -> None:
        if self.train_sums.update_called:  # not in an epoch a resumed run only finishes
            self.log("train/acc", metrics_from_sums(self.train_sums.compute(), False)["acc"])
        self.train_sums.reset()

    def _eval_step(self, batch: dict[str, Tensor], sums: EvalSums) -> None:
        logits, labels = self.logits_and_labels(batch)
        sums(batch_sums(logits, labels, self.token_bytes))

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, self.val_sums)

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, self.test_sums)

    def _log_eval(self, stage: str, sums: EvalSums) -> dict[str, float]:
        metrics = metrics_from_sums(sums.compute(), self.reports_bpb)
        sums.reset()
        for key, value in metrics.items():  # the same on every process (EvalSums is reduced across them)
            self.log(f"{stage}/{key}", value, prog_bar=key != "bpb", sync_dist=True)
        return metrics

    def on_validation_epoch_end(self) -> None:
        metrics = self._log_eval("val", self.val_sums)
        if self.trainer.sanity_checking:
            return
        self.val_acc_best(metrics["acc"])
        best = float(self.val_acc_best.compute())
        self.log("val/acc_best", best, prog_bar=True, sync_dist=True)
        self.last_val_step = self.global_step
        self.final_metrics.update({f"val/{k}": v for k, v in metrics.items()}, **{"val/acc_best": best})
        self.record_validation({f"val/{k}": float(v) for k, v in metrics.items()})
        if getattr(self, "_last_loss", None) is not None:
            self.final_metrics["train/loss"] = float(self._last_loss)

    def record_validation(self, metrics: dict[str, float]) -> None:
        """Add a validation to the history; note the step the endpoint metric first reached its threshold and, with
        `stop_at_threshold`, end training there."""
        if self.history["step"] and self.history["step"][-1] == self.global_step:
            return  # the closing validation of a run already validated at this step
        self.history["step"].append(self.global_step)
        for key, value in metrics.items():
            self.history.setdefault(key, []).append(value)
        end = self.hparams.get("endpoint") or {}
        value, threshold = metrics.get(end.get("metric", "val/acc")), end.get("threshold")
        if threshold is None or value is None or self.threshold_step is not None:
            return
        if (value <= threshold) if lower_is_better(end["metric"]) else (value >= threshold):
            self.threshold_step = self.global_step
            if end.get("stop_at_threshold") and self.trainer.state.fn == "fit":
                self.trainer.should_stop = True

    def on_train_end(self) -> None:
        if getattr(self, "_last_loss", None) is not None:
            self.final_metrics["train/loss"] = float(self._last_loss)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        elapsed = time.perf_counter() - self._fit_start if getattr(self, "_fit_start", None) else 0.0
        checkpoint["mhalab"] = {"tokens_seen": self.tokens_seen, "fit_s": self.fit_s + elapsed,
                                "last_val_step": self.last_val_step, "final_metrics": dict(self.final_metrics),
                                "history": {k: list(v) for k, v in self.history.items()},
                                "threshold_step": self.threshold_step}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("mhalab") or {}
        self.tokens_seen = int(state.get("tokens_seen", 0))
        self.fit_s = float(state.get("fit_s", 0.0))
        self.last_val_step = int(state.get("last_val_step", -1))
        self.final_metrics = dict(state.get("final_metrics") or {})
        self.history = {k: list(v) for k, v in (state.get("history") or {"step": []}).items()}
        self.threshold_step = state.get("threshold_step")

    def on_fit_start(self) -> None:
        self._fit_start = time.perf_counter()

    def on_train_start(self) -> None:
        restart_training_iterator(self.trainer)

    def on_fit_end(self) -> None:
        self.fit_s += time.perf_counter() - self._fit_start
        self._fit_start = None

    def on_test_epoch_end(self) -> None:
        self._log_eval("test", self.test_sums)

    def configure_optimizers(self) -> dict[str, Any]:
        o = self.hparams.optim
        decay = [p for p in self.parameters() if p.requires_grad and p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.requires_grad and p.dim() < 2]
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": o["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
            lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"],
            **adamw_kwargs(o.get("fused"), decay + no_decay,
                           clips_under_amp(self.trainer.precision, self.trainer.gradient_clip_val)))
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = int(o["warmup_ratio"] * total) if o.get("warmup_ratio") is not None else o["warmup_steps"]
        warmup = min(warmup, total)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: lr_lambda(step, warmup, total, o["min_lr_ratio"]))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def variant(module: AttentionLitModule, **attention: Any) -> AttentionLitModule:
    """A new module like `module` (same model sizes, optimiser settings, token bytes) with some attention sizes
    changed, e.g. `variant(m, n_kv_heads=2)`; its weights are freshly initialised."""
    import copy

    arch = copy.deepcopy(dict(module.hparams["arch"]))
    arch["attention"] = {**arch["attention"], **attention}
    return AttentionLitModule(arch, copy.deepcopy(dict(module.hparams["optim"])), module.hparams.get("token_bytes"))
