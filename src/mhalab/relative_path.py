"""The one rule for a path as seen from a folder: a summary's checkpoints and plots (relative to their run directory,
so a copied run stays whole) and a table's links (relative to the folder the table is read from)."""

from __future__ import annotations

import os
from pathlib import Path


def relative(target: Path | str, base: Path | str) -> str:
    """target's path as seen from the folder base, with forward slashes (both resolved: either may be relative to
    the working folder)."""
    return Path(os.path.relpath(Path(target).resolve(), Path(base).resolve())).as_posix()
