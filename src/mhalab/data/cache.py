"""Cache folders that cannot lie: keys derived from content.

``key(parts)`` hashes everything a cached folder's content depends on; ``file_digest`` and ``tree_digest``
turn source files into such parts.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any


# -- keys ------------------------------------------------------------------------------------------------
def canonical(parts: Any) -> str:
    """``parts`` as canonical JSON (sorted keys); raises TypeError for values JSON cannot hold."""
    return json.dumps(parts, sort_keys=True, separators=(",", ":"), allow_nan=False)


def key(parts: Any) -> str:
    """The full sha256 (hex) of ``parts``: everything the cached content depends on."""
    return hashlib.sha256(canonical(parts).encode()).hexdigest()


def file_digest(path: str | os.PathLike) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def tree_digest(root: Path) -> str:
    """One sha256 over the relative path and content of every file under ``root``."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(f"{path.relative_to(root).as_posix()}\0{file_digest(path)}\n".encode())
    return h.hexdigest()
