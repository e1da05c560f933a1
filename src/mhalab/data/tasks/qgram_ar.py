"""q-gram associative recall: MQAR whose keys are q tokens long (`mhalab.data.qgram_ar`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mhalab.data import qgram_ar
from mhalab.data.tasks.base import TaskInfo
from mhalab.data.tasks.mqar import Mqar, MqarConfig


@dataclass
class QgramConfig(MqarConfig):
    """Generator settings for ``task: qgram_ar``: MQAR whose keys are ``key_len`` tokens (docs/tasks.md)."""

    seq_len: int = 32
    n_kv_pairs: int = 4
    key_len: int = 2
    n_key_tokens: int = 2  # distinct key tokens per example; n_key_tokens ** key_len keys in all

    node: ClassVar[str] = "qgram_ar"


class QgramAr(Mqar):
    """MQAR with q-token keys: one position must gather q tokens to match a query."""

    name = "qgram_ar"
    settings = QgramConfig
    info = TaskInfo("clm", "qgram_ar", default_tokenizer="ids")

    def check_generator(self, g, seed: int) -> None:
        qgram_ar.check_qgram_ar(g.n_train, g.seq_len, g.n_kv_pairs, g.key_len, g.n_key_tokens, g.vocab_size,
                                g.power_a, seed)

    def generate(self, g, seed: int) -> dict:
        return qgram_ar.generate_qgram_ar_splits(g.n_train, g.n_val, g.n_test, g.seq_len, g.n_kv_pairs, g.key_len,
                                                 g.n_key_tokens, g.vocab_size, g.power_a, seed)
