"""The ``data`` config node: its keys, their defaults and their checks."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from mhalab.errors import ConfigError

OBJECTIVES = ("classification", "mlm", "clm")
TOKENIZERS = ("byte", "bpe", "listops")


@dataclass(frozen=True)
class TaskInfo:
    """What a task is: its default objective, where its text comes from and its classes."""

    objective: str
    source: str  # "bbc_news" | "listops" | "hub"
    label_names: tuple[str, ...] | None = None  # None: a language-modelling-only task
    hub_repo: str | None = None
    hub_config: str | None = None
    text_column: str = "text"  # the column name in the hub dataset
    default_tokenizer: str = "byte"


TASKS: dict[str, TaskInfo] = {
    "bbc_news": TaskInfo("classification", "bbc_news", ("business", "entertainment", "politics", "sports", "tech")),
    "bbc_news_mlm": TaskInfo("mlm", "bbc_news"),
    "listops": TaskInfo("classification", "listops", tuple(str(d) for d in range(10)), default_tokenizer="listops"),
    "ag_news": TaskInfo("classification", "hub", ("World", "Sports", "Business", "Sci/Tech"), "fancyzhx/ag_news"),
    "imdb": TaskInfo("classification", "hub", ("neg", "pos"), "stanfordnlp/imdb"),
    "sst2": TaskInfo("classification", "hub", ("negative", "positive"), "stanfordnlp/sst2", text_column="sentence"),
    "wikitext2": TaskInfo("mlm", "hub", None, "Salesforce/wikitext", "wikitext-2-raw-v1"),
    "tiny_shakespeare": TaskInfo("clm", "hub", None, "karpathy/tiny_shakespeare"),
}


@dataclass
class ListOpsConfig:
    """Generator settings for ``task: listops`` (LRA: 10, 10, 500, 2000, 96000, 2000, 2000)."""

    max_depth: int = 6
    max_args: int = 10
    min_length: int = 32
    max_length: int = 127
    n_train: int = 8000
    n_val: int = 1000
    n_test: int = 1000


@dataclass
class DataConfig:
    """Every key of the ``data`` node; ``conf/data/*.yaml`` documents them."""

    task: str = "bbc_news"
    objective: str | None = None  # None: the task's default
    path: Any = None  # str | list[str] | dict[split, str | list[str]]
    tokenizer: str | None = None  # None: the task's default
    vocab_size: int = 1000
    max_len: int = 256
    batch_size: int = 32
    num_workers: int = 0
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    split_seed: int = 0
    text_column: str | None = None  # None: "text" (the hub dataset's own column for hub tasks)
    label_column: str = "label"
    mlm_probability: float = 0.15
    cache_dir: str | None = None  # None: ./data_cache
    hf_cache_dir: str | None = None  # None: the Hugging Face datasets cache (HF_DATASETS_CACHE)
    n_classes: int | None = None  # None: the task's number of classes
    limit: int | None = None  # at most this many examples per split
    listops: ListOpsConfig = field(default_factory=ListOpsConfig)

    @classmethod
    def from_any(cls, cfg: Any) -> DataConfig:
        """Build from a DictConfig, a dict or a DataConfig; fill task defaults; check every value."""
        if isinstance(cfg, DataConfig):
            return cfg
        if cfg is None:
            cfg = {}
        if not isinstance(cfg, dict):
            from omegaconf import OmegaConf
            from omegaconf.errors import InterpolationResolutionError

            try:
                cfg = OmegaConf.to_container(cfg, resolve=True)
            except InterpolationResolutionError as e:
                reason = str(e).splitlines()[0]
                raise ConfigError(f"a data key cannot be resolved ({reason}); define it, e.g. paths.cache_dir.") from e
        cfg = dict(cfg)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(k for k in cfg if k not in known and not str(k).startswith("_"))
        if unknown:
            raise ConfigError(f"unknown data key(s) {unknown}; allowed keys are {sorted(known)}.")
        listops_cfg = cfg.pop("listops", None) or {}
        lo_known = {f.name for f in dataclasses.fields(ListOpsConfig)}
        lo_unknown = sorted(k for k in listops_cfg if k not in lo_known)
        if lo_unknown:
            raise ConfigError(f"unknown data.listops key(s) {lo_unknown}; allowed keys are {sorted(lo_known)}.")
        out = cls(**{k: v for k, v in cfg.items() if k in known}, listops=ListOpsConfig(**listops_cfg))
        out._fill_and_check()
        return out

    @property
    def info(self) -> TaskInfo:
        return TASKS[self.task]

    @property
    def n_labels(self) -> int | None:
        """Number of classes for classification, else None."""
        if self.objective != "classification":
            return None
        return self.n_classes if self.n_classes is not None else len(self.info.label_names)

    @property
    def label_names(self) -> list[str] | None:
        if self.objective != "classification":
            return None
        names = self.info.label_names
        return list(names) if names is not None and len(names) == self.n_labels else None

    def _fill_and_check(self) -> None:
        if self.task not in TASKS:
            raise ConfigError(f"data.task={self.task!r} is unknown; allowed tasks are {list(TASKS)}.")
        info = self.info
        self.objective = self.objective or info.objective
        self.tokenizer = self.tokenizer or info.default_tokenizer
        if self.text_column is None:
            self.text_column = "text" if self.path is not None else info.text_column
        if self.cache_dir is None:
            self.cache_dir = os.path.join(os.getcwd(), "data_cache")
        if isinstance(self.cache_dir, str) and "${" in self.cache_dir:
            raise ConfigError(f"data.cache_dir={self.cache_dir!r} is an unresolved interpolation; give a directory.")
        _check_choice("data.objective", self.objective, OBJECTIVES)
        _check_choice("data.tokenizer", self.tokenizer, TOKENIZERS)
        if self.objective == "classification" and info.label_names is None and self.n_classes is None:
            raise ConfigError(
                f"data.objective=classification needs labels but data.task={self.task} is a language-modelling "
                "task; use data.objective=mlm or clm (or give data.n_classes with a labelled data.path)."
            )
        if self.tokenizer == "listops" and self.task != "listops":
            raise ConfigError("data.tokenizer=listops only fits data.task=listops; use byte or bpe.")
        _check_int("data.max_len", self.max_len, 2)
        _check_int("data.batch_size", self.batch_size, 1)
        _check_int("data.num_workers", self.num_workers, 0)
        _check_int("data.split_seed", self.split_seed, 0)
        if self.tokenizer == "bpe":
            _check_int("data.vocab_size", self.vocab_size, 261, "bpe needs the 256 bytes and 5 special tokens")
        if self.n_classes is not None:
            _check_int("data.n_classes", self.n_classes, 2)
        if self.limit is not None:
            _check_int("data.limit", self.limit, 1)
        for key in ("val_fraction", "test_fraction"):
            value = getattr(self, key)
            if not isinstance(value, (int, float)) or not 0 < value < 1:
                raise ConfigError(f"data.{key}={value!r} must be a number strictly between 0 and 1.")
        if self.val_fraction + self.test_fraction >= 1:
            raise ConfigError("data.val_fraction + data.test_fraction must be below 1 to leave a training split.")
        if not 0 < self.mlm_probability < 1:
            raise ConfigError(f"data.mlm_probability={self.mlm_probability!r} must be strictly between 0 and 1.")
        if self.task == "listops" and self.path is None:
            lo = self.listops
            for key in ("max_depth", "max_args", "min_length", "max_length", "n_train", "n_val", "n_test"):
                _check_int(f"data.listops.{key}", getattr(lo, key), 2 if key in ("max_depth", "max_args") else 1)
            if lo.min_length > lo.max_length:
                raise ConfigError("data.listops.min_length must not exceed data.listops.max_length.")
            if lo.max_length + 1 > self.max_len:
                raise ConfigError(
                    f"data.listops.max_length={lo.max_length} must be below data.max_len={self.max_len} "
                    "(one position holds [CLS]) so that no expression is cut."
                )


def _check_choice(key: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not allowed; use one of {list(allowed)}.")


def _check_int(key: str, value: Any, minimum: int, why: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key}={value!r} must be an integer >= {minimum}{' (' + why + ')' if why else ''}.")
