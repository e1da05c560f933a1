"""HeadStatsCallback: per-head attention statistics on a fixed probe batch, logged while training.

Every `every_n_steps` optimizer steps and at each validation end, one extra no-grad pass asks the model for its
attention weights (the math path; training keeps the fast sdpa backend) and logs, for every layer l and head h,
`attn/L{l}H{h}/{stat}`, plus per-layer summaries `attn/L{l}/{stat}_mean` and the GQA group similarity
`attn/L{l}/within_group_jsd` / `between_group_jsd`. At the end of training it computes head importance (Michel et al.
2019) and draws the pictures into <run_dir>/plots (logged to wandb as images too). Definitions of every statistic:
docs/definitions.md#per-head-statistics.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor

from mhalab import stats as S

log = logging.getLogger(__name__)


class HeadStatsCallback(L.Callback):
    def __init__(self, probe_batch: dict[str, Tensor], every_n_steps: int = 50, importance: bool = True,
                 importance_batches: int = 8, plots: bool = True, plot_dir: str | Path | None = None,
                 decode=None, max_plot_tokens: int = 48):
        self.probe = probe_batch
        self.every_n_steps = every_n_steps
        self.importance = importance
        self.importance_batches = importance_batches
        self.plots = plots
        self.plot_dir = Path(plot_dir) if plot_dir is not None else None
        self.decode = decode  # ids -> list of token strings, for plot tick labels
        self.max_plot_tokens = max_plot_tokens
        self.table: dict[str, dict[str, float]] = {}  # latest {"L0H0": {stat: value}}
        self.groups: dict[str, dict[str, Any]] = {}  # latest {"L0": kv_group_similarity(...)}
        self.importance_table: dict[str, float] = {}
        self.attentions: list[Tensor] = []  # latest probe weights, n_layers x (B, H, T, T)
        self.plot_paths: list[str] = []

    # --- the measurement -------------------------------------------------------------------------------
    @torch.no_grad()
    def measure(self, pl_module: L.LightningModule) -> tuple[dict, dict, list[Tensor]]:
        """Statistics of every layer on the probe batch; returns (table, groups, weights per layer)."""
        was_training = pl_module.training
        pl_module.eval()
        try:
            batch = {k: v.to(pl_module.device) for k, v in self.probe.items()}
            attentions = pl_module(batch, need_weights=True).attentions  # n_layers x (B, H, T, T)
        finally:
            pl_module.train(was_training)
        pad = batch.get("padding_mask")
        causal = pl_module.model_cfg.causal
        per_layer, groups = [], {}
        for layer, w in enumerate(attentions):
            per_layer.append(S.head_stats(w, pad, causal=causal))
            sim = S.head_similarity(w, pad)
            groups[f"L{layer}"] = S.kv_group_similarity(sim, pl_module.model_cfg.n_kv_heads)
        return S.stats_table(per_layer), groups, attentions

    def _log(self, pl_module: L.LightningModule, table: dict, groups: dict) -> None:
        metrics = {f"attn/{head}/{stat}": v for head, row in table.items() for stat, v in row.items()}
        n_layers = pl_module.model_cfg.n_layers
        for layer in range(n_layers):
            rows = [row for head, row in table.items() if head.startswith(f"L{layer}H")]
            for stat in S.STAT_NAMES:
                metrics[f"attn/L{layer}/{stat}_mean"] = sum(r[stat] for r in rows) / len(rows)
            for key in ("within_group_jsd", "between_group_jsd"):
                value = groups[f"L{layer}"][key]
                if not math.isnan(value):
                    metrics[f"attn/L{layer}/{key}"] = value
        for logger in pl_module.loggers:
            logger.log_metrics(metrics, step=pl_module.global_step)

    def update(self, pl_module: L.LightningModule) -> None:
        self.table, self.groups, self.attentions = self.measure(pl_module)
        self._log(pl_module, self.table, self.groups)

    # --- Lightning hooks ---------------------------------------------------------------------------------
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        step = trainer.global_step  # optimizer steps done
        if step % self.every_n_steps == 0 and trainer.is_global_zero:
            self.update(pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and trainer.is_global_zero and trainer.state.fn == "fit":
            self.update(pl_module)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        self.update(pl_module)
        if self.importance:
            loader = trainer.datamodule.val_dataloader() if trainer.datamodule is not None else None
            self.importance_table = self.compute_importance(pl_module, loader)
        if self.plots and self.plot_dir is not None:
            self.draw(pl_module)

    # --- importance and pictures -------------------------------------------------------------------------
    def compute_importance(self, pl_module: L.LightningModule, loader=None) -> dict[str, float]:
        """Head importance over the first `importance_batches` batches of loader (default: the probe batch)."""
        batches = []
        for batch in loader or []:
            batches.append({k: v.to(pl_module.device) for k, v in batch.items()})
            if len(batches) >= self.importance_batches:
                break
        if not batches:
            batches = [{k: v.to(pl_module.device) for k, v in self.probe.items()}]
        was_training = pl_module.training
        pl_module.eval()
        try:
            imp = S.head_importance(pl_module, batches, lambda m, b: m.loss_and_logits(b)[0])  # (L, H)
        finally:
            pl_module.train(was_training)
        return {f"L{l}H{h}": float(imp[l, h]) for l in range(imp.shape[0]) for h in range(imp.shape[1])}

    def draw(self, pl_module: L.LightningModule) -> None:
        from mhalab import plots

        self.plot_dir.mkdir(parents=True, exist_ok=True)
        table = {head: dict(row) for head, row in self.table.items()}
        for head, value in self.importance_table.items():
            table[head]["importance"] = value
        paths = plots.plot_stat_heatmaps(table, self.plot_dir)
        attentions = self.attentions or self.measure(pl_module)[2]
        ids = self.probe["input_ids"][0]
        pad = self.probe.get("padding_mask")
        n_valid = int((~pad[0]).sum()) if pad is not None else ids.numel()
        tokens = self.decode(ids[:n_valid].tolist()) if self.decode else [str(i) for i in ids[:n_valid].tolist()]
        maps = [w[0, :, :n_valid, :n_valid].float().cpu() for w in attentions]  # n_layers x (H, T, T)
        paths.append(plots.plot_attention_maps(maps, tokens, self.plot_dir / "attention_maps.png",
                                               max_tokens=self.max_plot_tokens))
        self.plot_paths = [str(p) for p in paths]
        for logger in pl_module.loggers:
            if hasattr(logger, "log_image"):
                logger.log_image(key="attn/pictures", images=self.plot_paths,
                                 caption=[Path(p).stem for p in self.plot_paths])
