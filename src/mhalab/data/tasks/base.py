"""What every data task is: a `Task` object with its `info`, its settings, its checks and `load()`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from mhalab.errors import ConfigError

if TYPE_CHECKING:
    from datasets import DatasetDict

DataConfig = Any  # a mhalab.data.config.DataConfig, which builds its nodes from the tasks here (not imported: a cycle)


@dataclass(frozen=True)
class TaskInfo:
    """What a task is: its default objective, where its text comes from and its classes."""

    objective: str
    source: str  # where the text comes from: "bbc_news" | "listops" | "hub" | "mqar" | "qgram_ar" | "file" | "user"
    label_names: tuple[str, ...] | None = None  # None: a language-modelling-only task
    hub_repo: str | None = None
    hub_config: str | None = None
    text_column: str = "text"  # the column name in the hub dataset
    default_tokenizer: str = "byte"  # "ids": the task gives token ids and per-position labels itself (synthetic)


class Task:
    """A data task: `info` says what it is (objective, classes, default tokenizer); `load` gives its text.

    Built-in tasks also have a `name` (their `data.task`) and may have `settings`: a dataclass whose fields are the
    keys of `data.<name>` (checked when it is made); `check(cfg)` refuses the combinations of keys the task cannot
    use, in one sentence naming the key and the allowed values.
    """

    name: ClassVar[str | None] = None  # a built-in task's data.task; None: a base class or your own task
    settings: ClassVar[type | None] = None  # a built-in task's data.<name> node, a dataclass
    info: TaskInfo = TaskInfo(objective="classification", source="user")

    def load(self, cfg: DataConfig) -> DatasetDict:
        """Raw splits as a `datasets.DatasetDict`: "train" (required), optionally "validation" and "test", each
        with a `text` column and, for classification, a `label` column (ids or names)."""
        raise NotImplementedError(f"{type(self).__name__} must define load(cfg)")

    def check(self, cfg: DataConfig) -> None:
        """Raise ConfigError for a (resolved) data config this task cannot use; every task: classification needs
        classes."""
        if cfg.objective == "classification" and self.info.label_names is None and cfg.n_classes is None:
            raise ConfigError(f"data.objective=classification with data.task={cfg.task}: a language-modelling task "
                              "has no labels; use data.objective=mlm or clm (or data.n_classes with a labelled "
                              "data.path)")

    def where(self, cfg: DataConfig) -> str:
        """Where the text comes from, for messages."""
        return f"task {cfg.task} (data.source)"

    def fingerprint(self) -> dict:
        """Digests of the content the text is read from, part of the cache key; {}: nothing local to digest."""
        return {}

    @classmethod
    def train_examples(cls, cfg: DataConfig) -> int | None:
        """Training examples per epoch where the settings fix them (generated tasks), else None (known only once
        the data is read)."""
        return None
