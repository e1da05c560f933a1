"""The order of training examples, and the epoch each one is drawn in, as pure functions of (seed, epoch).

`EpochSampler` yields `(epoch, index)` pairs: a permutation drawn from (seed, epoch) alone, starting after the
batches a resumed run has already trained on. `EpochIndexed` hands the epoch to each example, so that random
choices made while collating (MLM masks) come from (seed, epoch, example index) inside whichever worker process
builds the batch. Results therefore do not depend on `num_workers`, and a run resumed mid-epoch sees exactly the
batches an uninterrupted one does.
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from mhalab.errors import ConfigError


class EpochSampler(Sampler[tuple[int, int]]):
    """A permutation of range(n) per epoch from (seed, epoch). `position()` -> (epoch, examples to skip) is asked
    when iteration starts (the training loop's restored progress); without it the epoch is `set_epoch`'s."""

    def __init__(self, n: int, seed: int, position: Callable[[], tuple[int, int]] | None = None):
        self.n, self.seed, self.epoch = n, seed, 0
        self.position = position

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def permutation(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch, skip = self.position() if self.position is not None else (self.epoch, 0)
        self.epoch = epoch
        return iter([(epoch, i) for i in self.permutation(epoch)[skip:]])

    def __len__(self) -> int:
        return self.n


class Columns(dict):
    """A batch read as whole columns, {column: (B, ...) tensor}, for a collator that takes one (`whole_batches`)."""


class EpochIndexed(Dataset):
    """A dataset indexed by `(epoch, index)` or by `index`; each example gets an `epoch` field (0 for plain
    indices: validation and test). With `whole_batches` (a collator that needs no per-example field but the data's
    own), a batch of a dataset that offers `rows(indices)` (`mhalab.data.arrow.ArrowSplit`) is read as `Columns`."""

    def __init__(self, dataset, whole_batches: bool = False):
        self.dataset = dataset
        self.whole_batches = whole_batches

    def __len__(self) -> int:
        return len(self.dataset)

    @staticmethod
    def _epoch_and_index(key) -> tuple[int, int]:
        return key if isinstance(key, tuple) else (0, key)

    def __getitem__(self, key):
        epoch, index = self._epoch_and_index(key)
        return {**self.dataset[index], "epoch": epoch}

    def __getitems__(self, keys: list) -> list[dict]:
        """A whole batch in one read (the DataLoader calls this instead of one __getitem__ per example)."""
        pairs = [self._epoch_and_index(k) for k in keys]
        if self.whole_batches and hasattr(self.dataset, "rows"):
            columns = self.dataset.rows([index for _, index in pairs])
            if columns is not None:
                return Columns(columns)
        columns = self.dataset[[index for _, index in pairs]]  # {column: [value per example]}
        return [{**{name: values[i] for name, values in columns.items()}, "epoch": epoch}
                for i, (epoch, _) in enumerate(pairs)]


class ResumableLoader(DataLoader):
    """A DataLoader Lightning treats as resumable: the position lives in `EpochSampler` (a function of the restored
    training progress), and the state a checkpoint keeps checks that the resumed run draws from the same data."""

    def state_dict(self) -> dict:
        s = self.sampler
        return {"n": s.n, "seed": s.seed} if isinstance(s, EpochSampler) else {}

    def load_state_dict(self, state: dict) -> None:
        s = self.sampler
        if isinstance(s, EpochSampler) and state and (state.get("n"), state.get("seed")) != (s.n, s.seed):
            raise ConfigError(f"the checkpoint was trained on {state.get('n')} examples with seed {state.get('seed')}, "
                              f"this run has {s.n} with seed {s.seed}: resume with the data settings it started with")
