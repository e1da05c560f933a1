"""Your own file(s), `data=file data.path=...`: the text and labels of local files (`mhalab.data.local_files`)."""

from __future__ import annotations

from mhalab.data.tasks.base import Task, TaskInfo
from mhalab.errors import ConfigError


def load_path(cfg):
    """``data.path``'s splits (it replaces any task's source): columns ``id``, ``text`` and, to classify,
    ``label``."""
    import os

    from mhalab.data import local_files

    label = cfg.label_column if cfg.objective == "classification" else None
    return local_files.load_local(cfg.path, cfg.text_column, label, os.path.join(cfg.cache_dir, "hf_datasets"))


def describe_path(cfg) -> str:
    from mhalab.data.paths import normalize_path

    return f"data.path file(s) {', '.join(f for fs in normalize_path(cfg.path).values() for f in fs)}"


class File(Task):
    """Classification (string labels name the classes) or language modelling on the files of data.path."""

    name = "file"
    info = TaskInfo("classification", "file")

    def check(self, cfg) -> None:
        """data.path is required; the files' own labels name the classes, so none are needed here."""
        if cfg.path is None:
            raise ConfigError("data.task=file needs data.path: a file, a list of files or {train: ..., validation: "
                              "..., test: ...} (CSV/TSV, JSON/JSONL, text or Parquet), e.g. data=file data.path=my.csv")

    def load(self, cfg):
        return load_path(cfg)

    def where(self, cfg) -> str:
        return describe_path(cfg)
