"""The ``data`` config node: its keys, their defaults and their checks.

``DataConfig.__post_init__`` checks every value that does not depend on the task; ``resolved()`` fills the task's
defaults (objective, tokenizer, text column) and checks the combinations that do, the task's own with its
``check`` (`mhalab.data.tasks`). Each built-in task with settings adds its node (``data.<task>``). This module
imports no torch.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from mhalab.checks import check_choice, check_int, walk
from mhalab.data.paths import normalize_path
from mhalab.data.tasks import TASKS, Task, TaskInfo
from mhalab.errors import ConfigError

__all__ = ["TASKS", "DataConfig", "TaskInfo", "normalize_path"]

OBJECTIVES = ("classification", "mlm", "clm")
TOKENIZERS = ("byte", "bpe", "listops", "ids")  # ids: a synthetic task's own token ids


# A built-in task's settings (its `settings` dataclass) are the data config's node named after it: data.listops, ...
SETTINGS: dict[str, type] = {name: task.settings for name, task in TASKS.items() if task.settings is not None}


@dataclass
class DataKeys:
    """The keys of the ``data`` node every task shares; `DataConfig` adds one node per task with settings."""

    task: str = "bbc_news"  # a built-in task (mhalab.data.tasks.TASKS; file: data.path), or your own (with `source`)
    source: Optional[Any] = None  # your own task: {_target_: your_package.YourTask, ...} (mhalab.data.tasks.Task)
    objective: Optional[str] = None  # classification | mlm | clm; None: the task's own
    path: Any = None  # local file(s) replacing the task's source: a file, a list, or {train: ..., validation: ...}
    tokenizer: Optional[str] = None  # byte | bpe | listops; None: the task's own
    vocab_size: int = 2000  # bpe only: vocabulary size, trained on the train split (>= 261)
    max_len: int = 256  # tokens per example ([CLS] included) or per language-modelling window
    batch_size: int = 32
    num_workers: int = 0  # DataLoader worker processes (results do not depend on it)
    val_fraction: float = 0.1  # share of the documents for validation when the source has no validation split
    test_fraction: float = 0.1  # share for test when the source has no (labelled) test split
    split_seed: int = 0  # seed of the document split and of generated tasks
    text_column: Optional[str] = None  # None: "text" (the hub dataset's own column for hub tasks)
    label_column: str = "label"
    mlm_probability: float = 0.15  # mlm only: share of tokens predicted (80% [MASK], 10% random, 10% kept)
    cache_dir: Optional[str] = None  # tokenized datasets are cached here; None: ./.cache/mhalab
    hf_cache_dir: Optional[str] = None  # None: the Hugging Face datasets cache (HF_DATASETS_CACHE)
    n_classes: Optional[int] = None  # None: the task's number of classes
    limit: Optional[int] = None  # at most this many examples per split (quick runs)

    def __post_init__(self):
        for name, cls in SETTINGS.items():
            if isinstance(getattr(self, name), dict):
                setattr(self, name, cls(**getattr(self, name)))
        if not isinstance(self.task, str) or not self.task or any(c in self.task for c in "/\\\0"):
            raise ConfigError(f"data.task={self.task!r}: a task name must be a non-empty text without '/', '\\' "
                              "or NUL (it names the task's cache folder)")
        if self.task not in TASKS and self.source is None:
            raise ConfigError(f"data.task={self.task!r} is unknown; allowed tasks are {', '.join(TASKS)}, or name "
                              "your own and give data.source={_target_: your.Task}")
        if self.objective is not None:
            check_choice("data.objective", self.objective, OBJECTIVES)
        if self.tokenizer is not None:
            check_choice("data.tokenizer", self.tokenizer, TOKENIZERS)
        check_int("data.max_len", self.max_len, 2)
        check_int("data.batch_size", self.batch_size, 1)
        check_int("data.num_workers", self.num_workers, 0)
        check_int("data.split_seed", self.split_seed, 0)
        check_int("data.vocab_size", self.vocab_size, 1)
        if self.n_classes is not None:
            check_int("data.n_classes", self.n_classes, 2)
        if self.limit is not None:
            check_int("data.limit", self.limit, 1)
        for key in ("val_fraction", "test_fraction", "mlm_probability"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
                raise ConfigError(f"data.{key}={value!r}: {key} must be a number strictly between 0 and 1")
        if self.val_fraction + self.test_fraction >= 1:
            raise ConfigError(f"data.val_fraction={self.val_fraction} with data.test_fraction={self.test_fraction}: "
                              "their sum must be below 1 to leave a training split")

    @classmethod
    def from_any(cls, cfg: Any) -> DataConfig:
        """The resolved config from a DataConfig, a dict or a DictConfig (unknown keys are an error)."""
        if isinstance(cfg, DataConfig):
            return cfg.resolved()
        if cfg is None:
            cfg = {}
        if not isinstance(cfg, dict):
            from omegaconf import OmegaConf
            from omegaconf.errors import InterpolationResolutionError

            try:
                cfg = OmegaConf.to_container(cfg, resolve=True)
            except InterpolationResolutionError as e:
                reason = str(e).splitlines()[0]
                raise ConfigError(f"a data key cannot be resolved ({reason}); define it, e.g. paths.cache_dir") from e
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(k for k in cfg if k not in known)
        if unknown:
            raise ConfigError(f"unknown data key {unknown[0]!r}: allowed keys are {', '.join(sorted(known))}")
        for name, sub in SETTINGS.items():
            sub_known = {f.name for f in dataclasses.fields(sub)}
            sub_unknown = sorted(k for k in (cfg.get(name) or {}) if k not in sub_known)
            if sub_unknown:
                raise ConfigError(f"unknown data.{name} key {sub_unknown[0]!r}: allowed keys are "
                                  f"{', '.join(sorted(sub_known))}")
        return cls(**cfg).resolved()

    def resolved(self) -> DataConfig:
        """A copy with the task's defaults filled in and the task-dependent combinations checked."""
        info = self.info
        out = dataclasses.replace(self, **{name: dataclasses.replace(getattr(self, name)) for name in SETTINGS})
        out.objective = self.objective or info.objective
        out.tokenizer = self.tokenizer or info.default_tokenizer
        if out.text_column is None:
            out.text_column = "text" if self.path is not None else info.text_column
        if out.cache_dir is None:
            out.cache_dir = os.path.join(os.getcwd(), ".cache", "mhalab")
        if "${" in str(out.cache_dir):
            raise ConfigError(f"data.cache_dir={out.cache_dir!r} is an unresolved interpolation; give a directory")
        self.task_object().check(out)
        if out.tokenizer == "listops" and info.default_tokenizer != "listops":
            fits = [name for name, task in TASKS.items() if task.info.default_tokenizer == "listops"]
            raise ConfigError(f"data.tokenizer=listops with data.task={out.task}: the listops vocabulary only fits "
                              f"data.task={' or '.join(fits)}; use byte or bpe")
        if (out.tokenizer == "ids") != (info.default_tokenizer == "ids"):
            synthetic = [name for name, task in TASKS.items() if task.info.default_tokenizer == "ids"]
            raise ConfigError(f"data.tokenizer={out.tokenizer} with data.task={out.task}: a synthetic task "
                              f"({', '.join(synthetic)}) brings its own ids (tokenizer ids), text tasks need byte, bpe "
                              "or listops")
        if out.tokenizer == "bpe":
            if out.vocab_size < 261:
                raise ConfigError(f"data.vocab_size={out.vocab_size} with data.tokenizer=bpe: vocab_size must be >= 261 "
                                  "(the 256 bytes and 5 special tokens)")
        return out

    @property
    def info(self) -> TaskInfo:
        return self.task_object().info

    @property
    def train_examples(self) -> int | None:
        """Training examples per epoch where the built-in task's settings fix them (a generated task without
        data.path), else None; your own task is not built for it (`Task.train_examples`)."""
        if self.source is not None or self.path is not None:
            return None
        return TASKS[self.task].train_examples(self)

    def task_object(self) -> Task:
        """The task, made once per config: the built-in one named data.task, or your own (data.source),
        instantiated once it passed the allow-list: an object with `info` (TaskInfo) and `load(cfg)`."""
        if "_task_object" in self.__dict__:  # made once per config (not a field: not in the cache key)
            return self.__dict__["_task_object"]
        if self.source is None:
            self.__dict__["_task_object"] = TASKS[self.task]()
            return self.__dict__["_task_object"]
        from hydra.utils import instantiate
        from omegaconf import DictConfig, ListConfig, OmegaConf

        from mhalab.targets import check_resolved

        # whoever wrote it (a config, a run's summary.json), it passes the allow-list and this process's grants
        source = self.source
        if isinstance(source, (DictConfig, ListConfig)):
            source = OmegaConf.to_container(source, resolve=True)
        check_resolved(source, "data.source")
        for key, value in walk(source, "data.source"):  # instantiate would resolve it again, into an unchecked node
            if isinstance(value, str) and "${" in value:
                raise ConfigError(f"{key}={value!r}: an interpolation left in the resolved data.source is refused "
                                  "(building the task would resolve it into a config node that is not checked)")
        try:
            task = instantiate(source)
        except Exception as e:  # noqa: BLE001 - the user's class: name it and what went wrong
            raise ConfigError(f"data.source={self.source!r} could not be built ({type(e).__name__}: {e})") from None
        if not isinstance(task, Task) or not isinstance(task.info, TaskInfo):
            raise ConfigError(f"data.source={self.source!r} must build an object with an `info` (a "
                              "mhalab.data.config.TaskInfo) and a `load(cfg)` method: a mhalab.data.tasks.Task "
                              "subclass")
        self.__dict__["_task_object"] = task
        return task

    @property
    def reports_bpb(self) -> bool:
        """Whether runs on this (resolved) data log bits per byte: language models of text, not of a synthetic
        task's ids (`mhalab.training.module.AttentionLitModule.reports_bpb`)."""
        return self.objective != "classification" and self.tokenizer != "ids"

    @property
    def n_labels(self) -> int | None:
        """Number of classes for classification, else None."""
        if self.objective != "classification":
            return None
        names = self.info.label_names
        return self.n_classes if self.n_classes is not None else len(names) if names is not None else None

    @property
    def label_names(self) -> list[str] | None:
        if self.objective != "classification":
            return None
        names = self.info.label_names
        return list(names) if names is not None and len(names) == self.n_labels else None


DataConfig = dataclasses.make_dataclass(
    "DataConfig", [(name, cls, field(default_factory=cls)) for name, cls in SETTINGS.items()], bases=(DataKeys,),
    namespace={"__doc__": "Every key of the ``data`` node: the shared keys (`DataKeys`) and data.<task> for each "
                          "built-in task with settings (`mhalab.data.tasks`)."})
DataConfig.__module__ = __name__  # pickled by name, like a class written here
