"""Raw splits -> token ids, cached on disk under ``cache_dir`` and keyed by everything that changes them.

Classification: one example per row, ``[CLS] + tokens`` cut to ``max_len``.
Language modelling (mlm/clm): within each split the documents are joined, each followed by ``[SEP]``,
and the stream is cut into consecutive windows of ``max_len`` tokens (the last one may be shorter).
Documents never cross splits because the splits are made on documents first.

Cache layout: ``<cache_dir>/mhalab_data/<task>-<key>/`` with ``dataset/`` (``DatasetDict.save_to_disk``),
``meta.json``, for BPE ``tokenizer.json``, and ``manifest.json``.  The key hashes ``key_parts``; how the
folder is written, checked and rebuilt is ``mhalab.data.cache``'s business.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, replace
from pathlib import Path

from typing import TYPE_CHECKING

import numpy as np

from mhalab.data import cache
from mhalab.data.arrow import ArrowSplit, load_splits
from mhalab.data.config import DataConfig
from mhalab.data.config import normalize_path
from mhalab.data.tokenization import BpeTokenizer, ByteTokenizer, IdsTokenizer, ListOpsTokenizer, Tokenizer
from mhalab.errors import ConfigError

if TYPE_CHECKING:  # building the cache needs `datasets`; reading it does not (mhalab.data.arrow)
    from datasets import Dataset, DatasetDict

CACHE_VERSION = 2  # bump when the processing below changes the token ids (2: content keys and manifest)
# DataConfig fields read only by the loaders, never by ``build``; every other field, present or future, is in the key.
LOADER_ONLY = frozenset({"batch_size", "num_workers", "mlm_probability", "cache_dir", "hf_cache_dir"})


def key_parts(cfg: DataConfig) -> dict:
    """Everything the token ids depend on: the settings, the task, the sources' content and CACHE_VERSION.

    Hub tasks are named by repository and config (``task``); ``datasets`` caches their downloads itself.
    """
    settings = {k: v for k, v in asdict(cfg).items() if k not in LOADER_ONLY}
    return {"version": CACHE_VERSION, "settings": settings, "task": asdict(cfg.info), "sources": source_digests(cfg)}


def source_digests(cfg: DataConfig) -> dict:
    """sha256 of the content of the files the raw text is read from (the task's `fingerprint`: none for generated
    and Hub tasks)."""
    if cfg.path is not None:
        return {split: [[f, _digest_or_none(f)] for f in files] for split, files in normalize_path(cfg.path).items()}
    return cfg.task_object().fingerprint()


def _digest_or_none(path: str) -> str | None:
    """The file's sha256; None if it is not a file (reading the data then says so)."""
    if not os.path.isfile(path):
        return None
    try:
        return cache.file_digest(path)
    except OSError as e:
        raise ConfigError(f"data.path file {path} cannot be read ({e.strerror or e}).") from e


def cache_key(cfg: DataConfig) -> str:
    """16 hex digits of the sha256 of ``key_parts`` (the manifest holds all 64 and is checked)."""
    return cache.key(key_parts(cfg))[:16]


def cache_path(cfg: DataConfig, parts: dict | None = None) -> Path:
    key = cache.key(parts if parts is not None else key_parts(cfg))
    return Path(cfg.cache_dir) / "mhalab_data" / f"{cfg.task}-{key[:16]}"


def make_tokenizer(cfg: DataConfig, train: Dataset) -> Tokenizer:
    """The configured tokenizer; BPE is trained on the training split only."""
    if cfg.tokenizer == "ids":
        return ids_tokenizer(cfg)
    if cfg.tokenizer == "listops":
        return ListOpsTokenizer()
    if cfg.tokenizer == "bpe":
        texts = (batch["text"] for batch in train.iter(batch_size=1000))
        return BpeTokenizer.train((t for batch in texts for t in batch), cfg.vocab_size)
    return ByteTokenizer()


def ids_tokenizer(cfg: DataConfig) -> IdsTokenizer:
    return IdsTokenizer(cfg.task_object().ids_vocab_size(cfg))


def load_tokenizer(cfg: DataConfig, folder: Path) -> Tokenizer:
    if cfg.tokenizer == "ids":
        return ids_tokenizer(cfg)
    if cfg.tokenizer == "bpe":
        return BpeTokenizer.load(str(folder / "tokenizer.json"))
    return ListOpsTokenizer() if cfg.tokenizer == "listops" else ByteTokenizer()


def features(kind: str):
    """The cached columns and their types, per kind of task: classification, lm or labelled."""
    from datasets import Features, List, Value

    return Features({"input_ids": List(Value("int32")),
                     **{"classification": {"label": Value("int64")}, "lm": {},
                        "labelled": {"labels": List(Value("int64"))}}[kind],
                     "idx": Value("int64")})


def tokenize_classification(ds: Dataset, tok: Tokenizer, max_len: int) -> Dataset:
    """``[CLS] + tokens`` truncated to ``max_len``, with the label and the row index ``idx``."""
    from datasets import Dataset

    ids = [[tok.cls_id] + t[: max_len - 1] for t in _encode_all(ds, tok)]
    return Dataset.from_dict({"input_ids": ids, "label": list(ds["label"]), "idx": list(range(len(ids)))},
                             features=features("classification"))


def tokenize_lm(ds: Dataset, tok: Tokenizer, max_len: int) -> Dataset:
    """The split's documents joined with ``[SEP]`` after each, cut into windows of ``max_len`` tokens."""
    from datasets import Dataset

    docs = [np.asarray([*ids, tok.sep_id], dtype=np.int32) for ids in _encode_all(ds, tok)]
    stream = np.concatenate(docs) if docs else np.zeros(0, dtype=np.int32)
    windows = [stream[i : i + max_len] for i in range(0, len(stream), max_len)]
    return Dataset.from_dict({"input_ids": windows, "idx": list(range(len(windows)))}, features=features("lm"))


def _encode_all(ds: Dataset, tok: Tokenizer) -> list[list[int]]:
    return [ids for batch in ds.iter(batch_size=1000) for ids in tok.encode_batch(batch["text"])]


def build(cfg: DataConfig, scratch: Path | None = None) -> tuple[DatasetDict, Tokenizer, dict]:
    """Load the raw splits, fit the tokenizer and tokenize (no cache involved); the result is held in memory.

    ``datasets`` keys its own cache of data.path files by path and mtime, not content, so with ``scratch``
    they are parsed afresh into that folder (``prepare`` gives one that is deleted after the build).
    """
    from datasets import Dataset, DatasetDict

    from mhalab.data.sources import load_raw

    raw = load_raw(replace(cfg, cache_dir=str(scratch)) if scratch is not None else cfg)
    tok = make_tokenizer(cfg, raw["train"])
    if tok.name == "ids":  # a synthetic task: the generator's ids and per-position labels, as they are
        data = DatasetDict({s: Dataset.from_dict({**ds.to_dict(), "idx": list(range(len(ds)))},
                                                 features=features("labelled")) for s, ds in raw.items()})
    else:
        encode = tokenize_classification if cfg.objective == "classification" else tokenize_lm
        data = DatasetDict({split: encode(ds, tok, cfg.max_len) for split, ds in raw.items()})
    if cfg.limit is not None:
        data = DatasetDict({s: ds.select(range(min(cfg.limit, len(ds)))) for s, ds in data.items()})
    names = raw["train"].features["label"].names if cfg.objective == "classification" else None
    meta = {
        "label_names": list(names) if names is not None else None,
        "n_classes": len(names) if names is not None else None,
        "n_documents": {split: len(ds) for split, ds in raw.items()},
    }
    return data, tok, meta


@contextlib.contextmanager
def quiet_progress():
    """Hide the ``datasets`` progress bars (map, filter, save) for the duration."""
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    was_disabled = are_progress_bars_disabled()
    disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            enable_progress_bars()


def prepare(cfg: DataConfig) -> Path:
    """The checked cache folder for ``cfg``, built (or rebuilt, if damaged) first when needed."""
    return _ensure(cfg, key_parts(cfg))


def load_cached(cfg: DataConfig, folder: Path, verified: bool = False) -> tuple[dict[str, ArrowSplit], Tokenizer,
                                                                               dict]:
    """Read what ``prepare`` wrote (split -> ``ArrowSplit``, indexed as the torch format of ``datasets``), after
    checking it against its manifest (rebuilding it if damaged), unless the caller has just had ``prepare`` do that
    (``verified``)."""
    parts = key_parts(cfg)
    if Path(folder).resolve() != cache_path(cfg, parts).resolve():
        raise ValueError(f"{folder} is not the cache folder of this data config ({cache_path(cfg, parts)}).")
    if not verified:
        folder = _ensure(cfg, parts)
    data = load_splits(folder / "dataset")
    meta = json.loads((folder / "meta.json").read_text())
    return data, load_tokenizer(cfg, folder), meta


def _ensure(cfg: DataConfig, parts: dict) -> Path:
    required = ["meta.json", "dataset/dataset_dict.json"] + (["tokenizer.json"] if cfg.tokenizer == "bpe" else [])
    return cache.ensure(cache_path(cfg, parts), parts, lambda scratch: _build_quietly(cfg, scratch), _save, required)


def _build_quietly(cfg: DataConfig, scratch: Path) -> tuple[DatasetDict, Tokenizer, dict]:
    with quiet_progress():
        return build(cfg, scratch)


def _save(built: tuple[DatasetDict, Tokenizer, dict], folder: Path) -> None:
    data, tok, meta = built
    with quiet_progress():
        data.save_to_disk(str(folder / "dataset"))
    if isinstance(tok, BpeTokenizer):  # written by Python, not by tokenizers' Rust, so a full disk is an OSError
        (folder / "tokenizer.json").write_text(tok.tok.to_str(pretty=True))
    (folder / "meta.json").write_text(json.dumps(meta, indent=2))
