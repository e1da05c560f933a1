"""Deterministic train/validation/test splits, stratified by label when there is one."""

from __future__ import annotations

import numpy as np
from datasets import DatasetDict

SPLITS = ("train", "validation", "test")


def split_indices(
    n: int, fractions: dict[str, float], seed: int, labels: list[int] | None = None
) -> dict[str, np.ndarray]:
    """Partition ``range(n)`` into the named parts (``fractions`` of each class; the first part takes the rest).

    Within each class, ``round(fraction * class_size)`` rows go to every part but the first.  Each part
    comes back in a seeded random order, so its first rows mix the classes.
    """
    rng = np.random.default_rng(seed)
    labels_arr = np.zeros(n, dtype=np.int64) if labels is None else np.asarray(labels)
    names = list(fractions)
    parts: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for cls in np.unique(labels_arr):
        idx = rng.permutation(np.flatnonzero(labels_arr == cls))
        start = 0
        for name in names[1:]:
            size = int(round(fractions[name] * len(idx)))
            parts[name].append(idx[start : start + size])
            start += size
        parts[names[0]].append(idx[start:])
    return {name: rng.permutation(np.concatenate(chunks)) if chunks else np.array([], dtype=np.int64)
            for name, chunks in parts.items()}


def complete_splits(
    dd: DatasetDict, val_fraction: float, test_fraction: float, seed: int, stratify: bool
) -> DatasetDict:
    """Return train/validation/test: the splits ``dd`` lacks are carved out of its train split."""
    missing = [s for s in ("validation", "test") if s not in dd]
    if not missing:
        return DatasetDict({s: dd[s] for s in SPLITS})
    train = dd["train"]
    fractions = {"train": 0.0, **{s: {"validation": val_fraction, "test": test_fraction}[s] for s in missing}}
    labels = list(train["label"]) if stratify else None
    parts = split_indices(len(train), fractions, seed, labels)
    out = {s: dd[s] for s in SPLITS if s in dd}
    out.update({name: train.select(idx) for name, idx in parts.items()})
    return DatasetDict({s: out[s] for s in SPLITS})

