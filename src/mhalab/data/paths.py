"""``data.path``, the local file(s) that replace a task's source, as ``{split: [absolute file, ...]}``."""

from __future__ import annotations

import os
from typing import Any

from mhalab.errors import ConfigError

SPLIT_ALIASES = {"train": "train", "validation": "validation", "val": "validation", "valid": "validation",
                 "dev": "validation", "test": "test"}


def normalize_path(path: Any) -> dict[str, list[str]]:
    """``data.path`` as ``{split: [absolute file, ...]}``."""
    if isinstance(path, str):
        return {"train": [os.path.abspath(os.path.expanduser(path))]}
    if isinstance(path, (list, tuple)) and path and all(isinstance(p, str) for p in path):
        return {"train": [os.path.abspath(os.path.expanduser(p)) for p in path]}
    if isinstance(path, dict) and path:
        out: dict[str, list[str]] = {}
        for split, files in path.items():
            if split not in SPLIT_ALIASES:
                raise ConfigError(f"data.path split {split!r} is unknown; use train, validation or test.")
            out[SPLIT_ALIASES[split]] = normalize_path(files)["train"]
        if "train" not in out:
            raise ConfigError("data.path given per split needs a 'train' entry.")
        return out
    raise ConfigError(f"data.path={path!r} must be a file, a list of files or a mapping of split to file(s).")
