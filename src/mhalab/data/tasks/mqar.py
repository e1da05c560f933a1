"""Multi-query associative recall (Zoology), generated locally from data.split_seed (`mhalab.data.mqar`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mhalab.checks import check_int
from mhalab.data import mqar
from mhalab.data.tasks.base import Task, TaskInfo
from mhalab.errors import ConfigError


@dataclass
class MqarConfig:
    """Generator settings for ``task: mqar`` (Zoology's multi-query associative recall; docs/tasks.md)."""

    vocab_size: int = 64  # task ids; keys from the lower half, values from the upper half (+5 special ids)
    seq_len: int = 64
    n_kv_pairs: int = 8
    n_train: int = 20000
    n_val: int = 1000
    n_test: int = 1000
    power_a: float = 0.01  # query gaps p(g) ~ g^(power_a - 1), Zoology's value

    node: ClassVar[str] = "mqar"  # where these settings live: data.<node>

    def __post_init__(self):
        for key in ("n_train", "n_val", "n_test"):
            check_int(f"data.{self.node}.{key}", getattr(self, key), 1)


class Mqar(Task):
    """Recall the value of each queried key: token ids and per-position labels straight from the generator."""

    name = "mqar"
    settings = MqarConfig
    info = TaskInfo("clm", "mqar", default_tokenizer="ids")

    def generator_settings(self, cfg):
        """This task's node of the data config (data.<name>)."""
        return getattr(cfg, self.name)

    def check(self, cfg) -> None:
        """The generator's settings fit together and into data.max_len; recall is next-token prediction."""
        super().check(cfg)
        g = self.generator_settings(cfg)
        self.check_generator(g, cfg.split_seed)
        if g.seq_len > cfg.max_len:
            raise ConfigError(f"data.{self.name}.seq_len={g.seq_len} is longer than data.max_len={cfg.max_len}: "
                              "raise data.max_len (and model.max_len)")
        if cfg.objective != "clm":
            raise ConfigError(f"data.objective={cfg.objective} with data.task={self.name}: recall is a next-token "
                              "task; use data.objective=clm")

    def check_generator(self, g, seed: int) -> None:
        mqar.check_mqar(g.n_train, g.seq_len, g.n_kv_pairs, g.vocab_size, g.power_a, seed)

    def generate(self, g, seed: int) -> dict:
        """{split: (input_ids, labels)} from the generator."""
        return mqar.generate_mqar_splits(g.n_train, g.n_val, g.n_test, g.seq_len, g.n_kv_pairs, g.vocab_size,
                                         g.power_a, seed)

    def load(self, cfg):
        """``input_ids`` and ``labels`` (-100 off the queries); data.limit keeps the first examples of each split."""
        from datasets import Dataset, DatasetDict

        splits = self.generate(self.generator_settings(cfg), cfg.split_seed)
        if cfg.limit is not None:
            splits = {s: (ids[:cfg.limit], labels[:cfg.limit]) for s, (ids, labels) in splits.items()}
        return DatasetDict({s: Dataset.from_dict({"input_ids": ids, "labels": labels}) for s, (ids, labels)
                            in splits.items()})

    def where(self, cfg) -> str:
        return f"the {self.name} generator"

    def ids_vocab_size(self, cfg) -> int:
        """Rows of the model's embedding: the task's ids after the offset of the special tokens."""
        return mqar.model_vocab_size(self.generator_settings(cfg).vocab_size)

    @classmethod
    def train_examples(cls, cfg) -> int:
        n = cls().generator_settings(cfg).n_train
        return min(n, cfg.limit or n)
