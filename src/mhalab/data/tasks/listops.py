"""ListOps (Long Range Arena), generated locally from data.split_seed (`mhalab.data.listops`)."""

from __future__ import annotations

from dataclasses import dataclass

from mhalab.checks import check_int
from mhalab.data import listops
from mhalab.data.tasks.base import Task, TaskInfo
from mhalab.errors import ConfigError


@dataclass
class ListOpsConfig:
    """Generator settings for ``task: listops`` (LRA: max_depth 10, max_args 10, lengths 500-2000,
    96000/2000/2000 examples)."""

    max_depth: int = 6
    max_args: int = 10
    min_length: int = 32
    max_length: int = 127
    n_train: int = 8000
    n_val: int = 1000
    n_test: int = 1000

    def __post_init__(self):
        for key in ("max_depth", "max_args"):
            check_int(f"data.listops.{key}", getattr(self, key), 2)
        for key in ("min_length", "max_length", "n_train", "n_val", "n_test"):
            check_int(f"data.listops.{key}", getattr(self, key), 1)
        if self.min_length > self.max_length:
            raise ConfigError(f"data.listops.min_length={self.min_length} exceeds data.listops.max_length="
                              f"{self.max_length}: min_length must not exceed max_length")


class ListOps(Task):
    """The value (0-9) of a nested MIN/MAX/MED/SM expression; its own 15-token vocabulary."""

    name = "listops"
    settings = ListOpsConfig
    info = TaskInfo("classification", "listops", tuple(listops.LABEL_NAMES), default_tokenizer="listops")

    def check(self, cfg) -> None:
        super().check(cfg)
        lo = cfg.listops
        if cfg.path is None and lo.max_length + 1 > cfg.max_len:
            raise ConfigError(f"data.listops.max_length={lo.max_length} with data.max_len={cfg.max_len}: "
                              "max_length must be below max_len (one position holds [CLS]) so no expression is cut")

    def load(self, cfg):
        lo = cfg.listops
        return listops.load_listops(lo.n_train, lo.n_val, lo.n_test, cfg.split_seed, lo.max_depth, lo.max_args,
                                    lo.min_length, lo.max_length)

    def where(self, cfg) -> str:
        return "ListOps"

    @classmethod
    def train_examples(cls, cfg) -> int:
        return min(cfg.listops.n_train, cfg.limit or cfg.listops.n_train)
