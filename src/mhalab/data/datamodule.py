"""``TextDataModule``: one LightningDataModule for every task, and ``build_datamodule`` to make it from config."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from mhalab.data import preprocessing
from mhalab.data.collate import (EVAL_MASK_SEEDS, CausalLMCollator, ClassificationCollator, LabelledCollator,
                                 MLMCollator)
from mhalab.data.config import DataConfig, normalize_path
from mhalab.data.tokenization import Tokenizer
from mhalab.data.sampling import EpochIndexed, EpochSampler, ResumableLoader


class TextDataModule(L.LightningDataModule):
    """Tokenized train/validation/test splits of one task and their loaders.

    ``prepare_data()`` builds the on-disk cache if it is missing; ``setup()`` reads it (building it
    first when ``prepare_data`` was not called) and is a no-op the second time. The cache is verified against its
    manifest once per process: by the first of them that runs (in DDP, ``setup`` on the ranks that do not prepare).
    """

    def __init__(self, cfg: DataConfig, batch_size: int | None = None, seed: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        # a run on your own file is recorded as that file's task, not as the task whose settings it borrowed
        self.task = cfg.task if cfg.path is None else f"file:{Path(normalize_path(cfg.path)['train'][0]).name}"
        self.objective = cfg.objective
        self.causal = cfg.objective == "clm"
        self.max_len = cfg.max_len
        self.batch_size = batch_size or cfg.batch_size
        self.seed = seed
        self.datasets: dict | None = None  # split -> tokenized ArrowSplit (examples as tensors), after setup()
        self._checked: Path | None = None  # the cache folder, once verified in this process
        self.tokenizer: Tokenizer | None = None
        self._token_bytes: torch.Tensor | None = None
        self.n_classes: int | None = None  # classification: from the data (setup)
        self.label_names: list[str] | None = None

    # -- Lightning hooks -------------------------------------------------------------------------
    def prepare_data(self) -> None:
        if self._checked is None:
            self._checked = preprocessing.prepare(self.cfg)

    def setup(self, stage: str | None = None) -> None:
        if self.datasets is not None:
            return
        self.prepare_data()  # builds or verifies the cache unless that was done in this process
        data, tok, meta = preprocessing.load_cached(self.cfg, self._checked, verified=True)
        self.datasets = data  # split -> ArrowSplit: examples as tensors, as datasets' torch format gives them
        self.tokenizer = tok
        self.n_classes, self.label_names = meta["n_classes"], meta["label_names"]

    def on_before_batch_transfer(self, batch: dict[str, torch.Tensor], dataloader_idx: int) -> dict:
        """A batch with nothing padded loses its all-False padding_mask (checked on the host, before the transfer):
        attention then takes the unmasked path, whose results on the CPU are the masked path's, bit for bit."""
        mask = batch.get("padding_mask")
        if mask is not None and mask.device.type == "cpu" and not mask.any():
            batch = {k: v for k, v in batch.items() if k != "padding_mask"}
        return batch

    # -- vocabulary facts --------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._tok.vocab_size

    @property
    def pad_id(self) -> int:
        return self._tok.pad_id

    @property
    def cls_id(self) -> int:
        return self._tok.cls_id

    @property
    def mask_id(self) -> int:
        return self._tok.mask_id

    @property
    def sep_id(self) -> int:
        return self._tok.sep_id

    @property
    def token_bytes(self) -> torch.Tensor | None:
        """LongTensor (vocab_size,): UTF-8 byte length of each token, 0 for special tokens (for bits per byte);
        None when the tokens are not text (synthetic tasks)."""
        if self._token_bytes is None:
            self._token_bytes = self._tok.token_bytes()
        return self._token_bytes

    def decode(self, ids) -> list[str]:
        """One readable token string per id (for plot tick labels)."""
        return self._tok.decode(ids)

    @property
    def _tok(self) -> Tokenizer:
        if self.tokenizer is None:
            raise RuntimeError("call setup() on the data module first")
        return self.tokenizer

    # -- loaders -----------------------------------------------------------------------------------
    def collate_fn(self, split: str):
        """The batch builder for ``split`` (MLM masks are random for train, fixed for validation/test)."""
        tok = self._tok
        if "labels" in self.datasets[split].column_names:
            return LabelledCollator(tok.pad_id)
        if self.objective == "classification":
            return ClassificationCollator(tok.pad_id)
        if self.objective == "clm":
            return CausalLMCollator(tok.pad_id)
        return MLMCollator(
            tok.pad_id, tok.mask_id, tok.n_special, tok.vocab_size, self.cfg.mlm_probability,
            eval_seed=EVAL_MASK_SEEDS.get(split), train_seed=self.seed if split == "train" else None,
        )

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        workers = self.cfg.num_workers
        sampler = EpochSampler(len(self.datasets[split]), self.seed, self._train_position) if shuffle else None
        collate = self.collate_fn(split)
        whole = isinstance(collate, (LabelledCollator, ClassificationCollator))  # no per-example randomness
        return ResumableLoader(
            EpochIndexed(self.datasets[split], whole_batches=whole),
            batch_size=self.batch_size,
            sampler=sampler,
            collate_fn=collate,
            num_workers=workers,
            persistent_workers=workers > 0,
            # forked as in a single run, also where the default is to spawn (a parallel sweep's loky worker)
            multiprocessing_context="fork" if workers and "fork" in multiprocessing.get_all_start_methods() else None,
        )

    def _train_position(self) -> tuple[int, int]:
        """(epoch, examples already trained on in it) from the training loop's progress, which a resumed run
        restores from its checkpoint: the order is a function of (seed, epoch), so skipping them continues exactly
        where the interrupted run stopped. (0, 0) outside a Trainer."""
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return 0, 0
        loop = trainer.fit_loop
        epoch = loop.epoch_progress.current.processed
        done = loop.epoch_loop.batch_progress.current.processed if loop.restarting else 0
        return epoch, done * self.batch_size * trainer.world_size

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("validation", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)

    def reference_levels(self) -> dict[str, float]:
        """What a model that ignores the input scores on this task (`mhalab.data.baselines`)."""
        from mhalab.data.baselines import classification_levels, unigram_levels

        train, val = self.datasets["train"], self.datasets["validation"]
        if "labels" in train.column_names:  # a synthetic recall task: chance and the most frequent value
            from mhalab.data import mqar

            return {"chance_acc": mqar.chance_accuracy(getattr(self.cfg, self.task).vocab_size),
                    "majority_acc": mqar.majority_accuracy(train.flat("labels"), val.flat("labels"))}
        if self.objective == "classification":
            return classification_levels(list(train["label"]), list(val["label"]), self.n_classes)
        if self.token_bytes is None:
            return {}

        def tokens(ds):  # every non-special token of a split, as one array
            ids = ds.flat("input_ids")
            return ids[ids >= self._tok.n_special]

        return unigram_levels(tokens(train), tokens(val), self.vocab_size, self.token_bytes.numpy())

    def probe_batch(self, n: int = 8) -> dict[str, torch.Tensor]:
        """The first ``n`` validation examples as one batch; the same on every call."""
        val = self.datasets["validation"]
        return self.collate_fn("validation")([val[i] for i in range(min(n, len(val)))])


def build_datamodule(cfg: Any, batch_size: int | None = None, seed: int = 0) -> TextDataModule:
    """A ``TextDataModule`` from the ``data`` config node (DictConfig or dict); call prepare_data/setup next."""
    return TextDataModule(DataConfig.from_any(cfg), batch_size=batch_size, seed=seed)
