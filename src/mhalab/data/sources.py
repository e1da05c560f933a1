"""The raw text of a task: train/validation/test splits with columns ``id``, ``text`` and (classification) ``label``."""

from __future__ import annotations

import os

from datasets import ClassLabel, Dataset, DatasetDict, Value

from mhalab.data import bbc_news, hub, listops, local_files
from mhalab.data.config import DataConfig
from mhalab.data.splits import SPLITS, complete_splits
from mhalab.errors import ConfigError


def load_raw(cfg: DataConfig) -> DatasetDict:
    """The task's splits, from ``data.path`` if given, else from the task's own source."""
    classify = cfg.objective == "classification"
    hf_cache = os.path.join(cfg.cache_dir, "hf_datasets")
    if cfg.path is not None:
        dd = local_files.load_local(cfg.path, cfg.text_column, cfg.label_column if classify else None, hf_cache)
        files = local_files.normalize_path(cfg.path)
        dd = DatasetDict({s: _labels(ds, cfg, f"data.path file(s) {files[s]}") for s, ds in dd.items()})
    elif cfg.info.source == "bbc_news":
        dd = DatasetDict({"train": bbc_news.load_bbc_news()})
    elif cfg.info.source == "listops":
        lo = cfg.listops
        dd = listops.load_listops(
            lo.n_train, lo.n_val, lo.n_test, cfg.split_seed, lo.max_depth, lo.max_args, lo.min_length, lo.max_length
        )
    else:
        dd = _load_hub(cfg)
    # Stratify whenever there are labels, so bbc_news_mlm gets exactly the documents splits of bbc_news.
    stratify = "label" in dd["train"].column_names
    dd = complete_splits(dd, cfg.val_fraction, cfg.test_fraction, cfg.split_seed, stratify=stratify)
    if not classify:  # language modelling: no labels, no blank documents (e.g. wikitext's empty lines)
        dd = DatasetDict(
            {s: ds.remove_columns([c for c in ds.column_names if c == "label"])
             .filter(lambda t: bool(t.strip()), input_columns="text") for s, ds in dd.items()}
        )
    for split, ds in dd.items():
        if len(ds) == 0:
            raise ConfigError(
                f"data.task={cfg.task} has an empty {split} split ({len(dd['train'])} training documents); give "
                f"more documents (a text file is split at blank lines) or a {split} file in data.path."
            )
    if cfg.limit is not None:
        dd = DatasetDict(
            {s: ds.shuffle(seed=cfg.split_seed).select(range(cfg.limit)) if len(ds) > cfg.limit else ds
             for s, ds in dd.items()}
        )
    return dd


def _load_hub(cfg: DataConfig) -> DatasetDict:
    """A hub task's train/validation/test; splits without labels (e.g. SST-2's test) are left out."""
    info = cfg.info
    dd = hub.load_hub(cfg.task, info.hub_repo, info.hub_config, cfg.hf_cache_dir)
    out = {}
    for split in SPLITS:
        if split not in dd:
            continue
        ds = dd[split]
        if cfg.text_column not in ds.column_names:
            raise ConfigError(
                f"data.text_column={cfg.text_column!r} is not a column of {info.hub_repo}; "
                f"columns are {ds.column_names}."
            )
        keep = {cfg.text_column: "text"}
        if cfg.objective == "classification":
            if cfg.label_column not in ds.column_names:
                raise ConfigError(
                    f"data.label_column={cfg.label_column!r} is not a column of {info.hub_repo}; "
                    f"columns are {ds.column_names}."
                )
            if min(ds[cfg.label_column]) < 0:  # unlabelled split (labels -1)
                continue
            keep[cfg.label_column] = "label"
        ds = ds.select_columns(list(keep)).rename_columns({k: v for k, v in keep.items() if k != v})
        ds = ds.add_column("id", [f"{split}-{i}" for i in range(len(ds))])
        out[split] = _labels(ds, cfg, f"{info.hub_repo} split {split!r}") if "label" in keep.values() else ds
    if "train" not in out:
        raise ConfigError(f"the Hub dataset {info.hub_repo} has no labelled 'train' split for data.task={cfg.task}.")
    return DatasetDict(out)


def _labels(ds: Dataset, cfg: DataConfig, where: str) -> Dataset:
    """Labels as int64 class ids in [0, n_classes): names are mapped through the task's label names."""
    if "label" not in ds.column_names:
        return ds
    n = cfg.n_labels
    feature = ds.features["label"]
    if isinstance(feature, Value) and feature.dtype in ("string", "large_string"):
        names = cfg.label_names
        found = sorted({str(x) for x in ds["label"]})
        if names is None or not set(found) <= set(names):
            raise ConfigError(
                f"{where}: labels {found[:10]} in data.label_column={cfg.label_column!r} are names, and the allowed "
                f"names are {names}; use those names or integer ids 0..{n - 1}."
            )
        ids = [names.index(x) for x in ds["label"]]
        ds = ds.remove_columns("label").add_column("label", ids)
    elif not isinstance(feature, ClassLabel) and not (isinstance(feature, Value) and "int" in feature.dtype):
        raise ConfigError(
            f"{where}: data.label_column={cfg.label_column!r} has type {feature}; it must hold integer ids "
            f"0..{n - 1} or class names."
        )
    labels = ds["label"]
    bad = [x for x in labels if x is None or not 0 <= x < n]
    if bad:
        raise ConfigError(
            f"{where}: data.label_column={cfg.label_column!r} holds {bad[0]!r}, outside the allowed ids 0..{n - 1} "
            f"(data.n_classes={n})."
        )
    return ds.cast_column("label", Value("int64"))
