"""A finished run in one call, for analysis in Python (a notebook, a script), as a TransformerLens user expects:

    from mhalab import open_run
    run = open_run("logs/train/runs/<id>")             # model (eval mode), tokenizer, data, summary
    batch = run.batch("validation")                     # one batch of a split, or run.probe() as the callback's
    logits, cache = run.run_with_cache(batch)           # every hook point (mhalab.hooks)
    cache["pattern", 0][:, 3]                           # (B, T, S): layer 0, head 3
    run.tokens(batch["input_ids"][0])                   # the tokens, for labelling a picture

The checkpoint is loaded safely (`mhalab.training.checkpoint.load_module`); the data is the run's own, rebuilt from its
summary.json (the tokenized cache is reused).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mhalab.errors import ConfigError
from mhalab.hooks import NameFilter, hooks, run_with_cache


@dataclass
class Run:
    """A finished run: its directory, summary, module (an AttentionLitModule in eval mode) and datamodule."""

    dir: Path
    summary: Any  # mhalab.runs.summary.RunSummary
    module: Any  # mhalab.training.module.AttentionLitModule
    data: Any  # mhalab.data.TextDataModule, set up

    @property
    def model(self) -> torch.nn.Module:
        """The bare model (SequenceClassifier or LanguageModel): model(input_ids, padding_mask)."""
        return self.module.model

    @property
    def tokenizer(self):
        return self.data.tokenizer

    def tokens(self, ids) -> list[str]:
        """Token strings of a sequence of ids."""
        return self.data.decode(ids.tolist() if isinstance(ids, Tensor) else list(ids))

    def batch(self, split: str = "validation", index: int = 0) -> dict[str, Tensor]:
        """Batch number `index` of a split ("train", "validation" or "test"), as training saw them."""
        loaders = {"train": self.data.train_dataloader, "validation": self.data.val_dataloader,
                   "test": self.data.test_dataloader}
        if split not in loaders:
            raise ConfigError(f"split {split!r}: choose one of {', '.join(loaders)}")
        for i, b in enumerate(loaders[split]()):
            if i == index:
                return self.module.to_device(b)
        raise ConfigError(f"the {split} split has fewer than {index + 1} batches")

    def probe(self, n: int | None = None) -> dict[str, Tensor]:
        """The statistics callback's probe batch (the first n validation examples; default the run's probe_size)."""
        n = n or int(self.summary.config.get("stats", {}).get("probe_size", 8))
        return self.module.to_device(self.data.probe_batch(n))

    @torch.no_grad()
    def run_with_cache(self, batch: dict[str, Tensor], names_filter: NameFilter = None) -> tuple[Tensor, Any]:
        """(logits, ActivationCache) of one no-grad pass over a batch."""
        out, cache = run_with_cache(self.module, batch, names_filter=names_filter)
        return out.logits, cache

    @torch.no_grad()
    def run_with_hooks(self, batch: dict[str, Tensor], fwd_hooks=()) -> Tensor:
        """The logits of one no-grad pass with `fwd_hooks` [(name, fn), ...] attached."""
        with hooks(self.module, fwd_hooks):
            return self.module(batch).logits


def open_run(run_dir: str | Path, checkpoint: str | Path | None = None, batch_size: int | None = None) -> Run:
    """Load a finished run: its summary, the checkpoint it tested (or `checkpoint`), and its data."""
    from mhalab.training.checkpoint import build_data, load_module
    from mhalab.runs.summary import read_summary

    run_dir = Path(run_dir)
    summary = read_summary(run_dir)
    if checkpoint is None:
        checkpoint = summary.path(run_dir, summary.checkpoints.get("best") or summary.checkpoints.get("last"))
        if checkpoint is None:
            raise ConfigError(f"{run_dir}/summary.json names no checkpoint; give one (open_run(..., checkpoint=...), "
                              "mhalab plots --checkpoint)")
    return Run(run_dir, summary, load_module(checkpoint), build_data(summary, batch_size, f"{run_dir}/summary.json"))
