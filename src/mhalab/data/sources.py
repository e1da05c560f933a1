"""The raw examples of a task: train/validation/test splits.

Text tasks give columns ``id``, ``text`` and, for classification, ``label``: integer class ids whose names are the
column's ``ClassLabel`` names (from the task, or from the file's own string labels). Synthetic tasks (MQAR,
q-gram recall) give ``input_ids`` and per-position ``labels`` directly.
"""

from __future__ import annotations

from datasets import ClassLabel, Dataset, DatasetDict, Value

from mhalab.data.config import DataConfig
from mhalab.data.splits import SPLITS, complete_splits
from mhalab.data.tasks import file
from mhalab.errors import ConfigError


def load_raw(cfg: DataConfig) -> DatasetDict:
    """The task's splits, from ``data.path`` if given, else from the task's own ``load``."""
    classify = cfg.objective == "classification"
    task = cfg.task_object()
    if cfg.path is None and cfg.info.default_tokenizer == "ids":  # a generator's ids and labels, as they are
        return task.load(cfg)
    if cfg.path is not None:
        dd, where = file.load_path(cfg), file.describe_path(cfg)
    else:
        dd, where = task.load(cfg), task.where(cfg)
        if not isinstance(dd, DatasetDict) or "train" not in dd:
            raise ConfigError(f"data.source of task {cfg.task}: load(cfg) must return a DatasetDict with a 'train' "
                              "split")
        dd = DatasetDict({s: ds if "id" in ds.column_names else ds.add_column("id", [f"{s}-{i}" for i in range(len(ds))])
                          for s, ds in dd.items() if s in SPLITS})
    if classify:
        dd = with_label_names(dd, cfg, where)
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


def with_label_names(dd: DatasetDict, cfg: DataConfig, where: str) -> DatasetDict:
    """Labels as int64 class ids with ClassLabel names, the same in every split.

    String labels: the task's names if every one is among them (in the task's order), else the file's own names,
    sorted. Integer labels: ids 0 .. n-1 with n = data.n_classes or the task's number of classes. A given
    data.n_classes must hold every class found.
    """
    feature = dd["train"].features.get("label")
    if feature is None:
        raise ConfigError(f"{where}: classification needs a label column (data.label_column={cfg.label_column!r})")
    if isinstance(feature, ClassLabel):
        names = list(feature.names)
    elif isinstance(feature, Value) and feature.dtype in ("string", "large_string"):
        found = sorted({str(x) for ds in dd.values() for x in ds["label"] if x is not None})
        known = cfg.info.label_names
        names = list(known) if known is not None and set(found) <= set(known) else found
        index = {name: i for i, name in enumerate(names)}
        dd = DatasetDict({s: ds.remove_columns("label").add_column(
            "label", [index.get(str(x)) if x is not None else None for x in ds["label"]]) for s, ds in dd.items()})
    elif isinstance(feature, Value) and "int" in feature.dtype:
        n = cfg.n_classes if cfg.n_classes is not None else len(cfg.info.label_names or ())
        if n < 2:
            raise ConfigError(f"{where}: integer labels need data.n_classes (how many classes there are)")
        names = list(cfg.info.label_names) if cfg.info.label_names and len(cfg.info.label_names) == n else \
            [str(i) for i in range(n)]
    else:
        raise ConfigError(f"{where}: data.label_column={cfg.label_column!r} has type {feature}; it must hold integer "
                          "ids or class names")
    if cfg.n_classes is not None and len(names) > cfg.n_classes:
        raise ConfigError(f"{where}: {len(names)} classes ({', '.join(names[:10])}) but data.n_classes="
                          f"{cfg.n_classes}; raise data.n_classes or leave it unset")
    n = max(len(names), cfg.n_classes or 0)
    names = names + [str(i) for i in range(len(names), n)]
    for split, ds in dd.items():
        bad = [x for x in ds["label"] if x is None or not 0 <= int(x) < n]
        if bad:
            raise ConfigError(f"{where}: data.label_column={cfg.label_column!r} holds {bad[0]!r} in the {split} "
                              f"split, outside the allowed ids 0..{n - 1} (data.n_classes={n})")
    return DatasetDict({s: ds.cast_column("label", ClassLabel(names=names)) for s, ds in dd.items()})
