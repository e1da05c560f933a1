"""The LightningModule: one model (classifier or LM), AdamW with warm-up + cosine, torchmetrics.

Logged metrics: train/loss, train/acc, val/loss, val/acc, val/acc_best, test/loss, test/acc; for LM objectives
also val/bpb and test/bpb (bits per UTF-8 byte of the predicted tokens).
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import MaxMetric, MeanMetric, SumMetric
from torchmetrics.classification import MulticlassAccuracy

from mhalab.model import EncoderConfig, build_model


def lr_lambda(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """Linear warm-up to 1, then cosine decay to min_lr_ratio at total_steps."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class AttentionLitModule(L.LightningModule):
    """Trains `build_model(EncoderConfig(**model_cfg), objective, n_classes)`.

    Args:
        model_cfg: EncoderConfig fields as a dict (kept in the checkpoint's hyperparameters).
        objective: "classification", "mlm" or "clm".
        n_classes: classes of a classification task (None for LM objectives).
        optim: lr, weight_decay, betas, eps, warmup_steps, warmup_ratio, min_lr_ratio.
        pooling, tie_weights: passed to build_model.
        token_bytes: (vocab_size,) UTF-8 bytes of each token, for bits-per-byte (LM objectives).
    """

    def __init__(self, model_cfg: dict, objective: str, n_classes: int | None, optim: dict,
                 pooling: str = "cls", tie_weights: bool = True, token_bytes: list[int] | None = None):
        super().__init__()
        self.save_hyperparameters()
        self.model_cfg = EncoderConfig(**model_cfg)
        self.objective = objective
        self.model = build_model(self.model_cfg, objective, n_classes, pooling, tie_weights)
        n_out = n_classes if objective == "classification" else self.model_cfg.vocab_size
        self.train_acc = MulticlassAccuracy(n_out, average="micro", ignore_index=-100)
        self.val_acc = MulticlassAccuracy(n_out, average="micro", ignore_index=-100)
        self.test_acc = MulticlassAccuracy(n_out, average="micro", ignore_index=-100)
        self.train_loss, self.val_loss, self.test_loss = MeanMetric(), MeanMetric(), MeanMetric()
        self.val_acc_best = MaxMetric()
        self.val_acc_best.persistent(True)  # saved in checkpoints, so a resumed run keeps its best
        self.is_lm = objective != "classification"
        if self.is_lm:
            tb = torch.tensor(token_bytes if token_bytes is not None else [1] * self.model_cfg.vocab_size)
            self.register_buffer("token_bytes", tb, persistent=False)
            self.val_nats, self.val_bytes = SumMetric(), SumMetric()
            self.test_nats, self.test_bytes = SumMetric(), SumMetric()
        self.tokens_seen = 0  # input tokens (padding included) through training steps

    def attention_layers(self):
        return self.model.attention_layers()

    def forward(self, batch: dict[str, Tensor], need_weights: bool = False):
        return self.model(batch["input_ids"], batch.get("padding_mask"), need_weights=need_weights)

    def loss_and_logits(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """(mean loss, logits flattened to (N, C), targets (N,) with -100 = ignore)."""
        logits = self(batch).logits
        labels = batch["labels"]
        if self.is_lm:
            logits, labels = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)  # (B*T, V), (B*T,)
        loss = F.cross_entropy(logits.float(), labels, ignore_index=-100)
        return loss, logits, labels

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss, logits, labels = self.loss_and_logits(batch)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss is {loss.item()} at step {self.global_step}")
        self.tokens_seen += batch["input_ids"].numel()
        self.train_loss(loss)
        self.train_acc(logits.detach(), labels)
        self.log("train/loss", self.train_loss, on_step=True, on_epoch=False, prog_bar=True)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True)
        return loss

    def _eval_step(self, batch: dict[str, Tensor], stage: str) -> None:
        loss, logits, labels = self.loss_and_logits(batch)
        getattr(self, f"{stage}_loss")(loss, weight=(labels != -100).sum())
        getattr(self, f"{stage}_acc")(logits, labels)
        self.log(f"{stage}/loss", getattr(self, f"{stage}_loss"), on_epoch=True, prog_bar=True)
        self.log(f"{stage}/acc", getattr(self, f"{stage}_acc"), on_epoch=True, prog_bar=True)
        if self.is_lm:
            valid = labels != -100
            nats = F.cross_entropy(logits.float()[valid], labels[valid], reduction="sum")
            getattr(self, f"{stage}_nats")(nats)
            getattr(self, f"{stage}_bytes")(self.token_bytes[labels[valid]].sum())

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def _log_bpb(self, stage: str) -> None:
        if self.is_lm:
            nats, nbytes = getattr(self, f"{stage}_nats"), getattr(self, f"{stage}_bytes")
            self.log(f"{stage}/bpb", nats.compute() / (math.log(2) * nbytes.compute().clamp_min(1)))
            nats.reset()
            nbytes.reset()

    def on_validation_epoch_end(self) -> None:
        self._log_bpb("val")
        if not self.trainer.sanity_checking:
            self.val_acc_best(self.val_acc.compute())
        self.log("val/acc_best", self.val_acc_best.compute() if self.val_acc_best.update_called else 0.0,
                 prog_bar=True)

    def on_test_epoch_end(self) -> None:
        self._log_bpb("test")

    def configure_optimizers(self) -> dict[str, Any]:
        o = self.hparams.optim
        decay = [p for p in self.parameters() if p.requires_grad and p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.requires_grad and p.dim() < 2]
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": o["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
            lr=o["lr"], betas=tuple(o.get("betas", (0.9, 0.999))), eps=o.get("eps", 1e-8))
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = int(o["warmup_ratio"] * total) if o.get("warmup_ratio") is not None else o.get("warmup_steps", 0)
        warmup = min(warmup, total)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: lr_lambda(step, warmup, total, o.get("min_lr_ratio", 0.1)))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
