"""q-gram associative recall: layout, full-grid keys, slot law, partial-key ceilings, determinism, validation."""

import itertools

import numpy as np
import pytest

from mhalab.data.mqar import ID_OFFSET, IGNORE_INDEX, split_seeds
from mhalab.data.qgram_ar import context_keys, generate_qgram_ar, generate_qgram_ar_splits, partial_key_accuracy
from mhalab.errors import ConfigError

V = 64  # key ids 1..31, value ids 32..63


def check_layout(ids, labels, n_kv_pairs, key_len, n_key_tokens, vocab_size=V):
    """Every structural promise of the module docstring; returns each record's query slot (n, P)."""
    n, seq_len = ids.shape
    q, R, C = key_len, key_len + 1, n_kv_pairs * (key_len + 1)
    assert ids.dtype == np.int32 and labels.dtype == np.int64 and labels.shape == ids.shape
    assert ids.min() >= ID_OFFSET and ids.max() < vocab_size + ID_OFFSET
    records = ids[:, :C].reshape(n, n_kv_pairs, R) - ID_OFFSET  # (n, P, q + 1) MQAR ids
    keys, values = records[:, :, :q], records[:, :, q]
    assert ((keys >= 1) & (keys < vocab_size // 2)).all()
    assert ((values >= vocab_size // 2) & (values < vocab_size)).all()
    slots = np.empty((n, n_kv_pairs), dtype=np.int64)
    for r in range(n):
        assert len({tuple(k) for k in keys[r]}) == n_kv_pairs  # each key once in the context
        assert len(np.unique(keys[r])) <= n_key_tokens and len(set(values[r])) == n_kv_pairs
        pos = np.flatnonzero(labels[r] != IGNORE_INDEX)
        assert len(pos) == n_kv_pairs and ((pos - C - (q - 1)) % R == 0).all() and (pos >= C + q - 1).all()
        for p in pos:  # the q tokens ending at p are a context key; the label is its value
            match = np.flatnonzero((keys[r] == ids[r, p - q + 1: p + 1] - ID_OFFSET).all(axis=1))
            assert len(match) == 1 and labels[r, p] == values[r, match[0]] + ID_OFFSET
            slots[r, match[0]] = (p - (q - 1) - C) // R
        assert len(set(slots[r])) == n_kv_pairs  # every key is queried exactly once
    return slots


@pytest.mark.parametrize("key_len, n_key_tokens, n_kv_pairs, seq_len", [(1, 8, 8, 64), (2, 3, 9, 64), (3, 2, 8, 64),
                                                                        (3, 4, 5, 50)])
@pytest.mark.parametrize("random_non_queries", [True, False])
def test_layout(key_len, n_key_tokens, n_kv_pairs, seq_len, random_non_queries):
    ids, labels = generate_qgram_ar(200, seq_len, n_kv_pairs, key_len, n_key_tokens, V, seed=2,
                                    random_non_queries=random_non_queries)
    assert ids.shape == (200, seq_len)
    slots = check_layout(ids, labels, n_kv_pairs, key_len, n_key_tokens)
    R, C = key_len + 1, n_kv_pairs * (key_len + 1)
    fixed = np.zeros(ids.shape, bool)  # context and query tokens; the rest is filler
    fixed[:, :C] = True
    np.put_along_axis(fixed, (C + slots[:, :, None] * R + np.arange(key_len)).reshape(200, -1), True, axis=1)
    if not random_non_queries:
        assert (ids[~fixed] == ID_OFFSET).all()
    else:
        assert 0.4 < np.mean(ids[~fixed] - ID_OFFSET < V // 2) < 0.6


def test_full_grid_uses_every_tuple():
    """n_kv_pairs = n_key_tokens ** key_len: the keys are all tuples over the example's alphabet."""
    ids, _ = generate_qgram_ar(50, 64, 8, 3, 2, V, seed=0)
    for keys in context_keys(ids, 8, 3):
        alphabet = np.unique(keys)
        assert len(alphabet) == 2
        assert sorted(map(tuple, keys)) == sorted(itertools.product(alphabet, repeat=3))


def test_partial_key_ceilings_on_the_full_grid():
    ids, _ = generate_qgram_ar(100, 64, 9, 2, 3, V, seed=0)  # 9 keys over 3 tokens
    assert partial_key_accuracy(ids, 9, 2, last=2) == 1.0
    assert partial_key_accuracy(ids, 9, 2, last=1) == pytest.approx(1 / 3)
    assert partial_key_accuracy(ids, 9, 2, last=0) == pytest.approx(1 / 9)
    assert partial_key_accuracy(ids, 9, 2, order_blind=True) == pytest.approx((3 * 1 + 6 * 0.5) / 9)  # AA | AB~BA


def test_query_slots_follow_power_law():
    n_slots = (64 - 8 * 3) // 3
    p = np.arange(1, n_slots + 1) ** (0.01 - 1.0)
    p /= p.sum()
    ids, labels = generate_qgram_ar(4000, 64, 8, 2, 3, V, power_a=0.01, seed=4)
    counts = np.bincount(check_layout(ids, labels, 8, 2, 3)[:, 0], minlength=n_slots)  # key 1: the first draw
    assert np.all(np.abs(counts - 4000 * p) <= 5 * np.sqrt(4000 * p * (1 - p)) + 1), (counts, np.round(4000 * p))


def test_deterministic_from_seed_and_splits():
    a = generate_qgram_ar(100, 64, 9, 2, 3, V, seed=5)
    b = generate_qgram_ar(100, 64, 9, 2, 3, V, seed=5)
    c = generate_qgram_ar(100, 64, 9, 2, 3, V, seed=6)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0]) and not np.array_equal(a[1], c[1])
    splits = generate_qgram_ar_splits(30, 20, 10, 64, 9, 2, 3, V, seed=0)
    assert [len(splits[s][0]) for s in ("train", "validation", "test")] == [30, 20, 10]
    val = generate_qgram_ar(20, 64, 9, 2, 3, V, seed=split_seeds(0)["validation"])
    assert np.array_equal(splits["validation"][0], val[0])


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"key_len": 0}, "key_len"),
        ({"seq_len": 5}, "seq_len"),  # one record and one slot of 3 tokens need 6
        ({"n_key_tokens": 32}, "n_key_tokens"),  # key ids are 1..31
        ({"n_key_tokens": 0}, "n_key_tokens"),
        ({"n_kv_pairs": 10}, "n_kv_pairs"),  # only 3 ** 2 = 9 distinct keys
        ({"n_kv_pairs": 9, "seq_len": 53}, "n_kv_pairs"),  # 9 records + 9 slots of 3 tokens need 54
        ({"vocab_size": 3}, "vocab_size"),
        ({"power_a": -1}, "power_a"),
        ({"n_examples": None}, "n_examples"),
        ({"seed": 1.5}, "seed"),
        ({"key_len": 40, "n_key_tokens": 31, "seq_len": 4000, "n_kv_pairs": 2}, "key_len"),  # 31 ** 40 tuples
    ],
)
def test_validation(kwargs, name):
    args = {"n_examples": 10, "seq_len": 64, "n_kv_pairs": 9, "key_len": 2, "n_key_tokens": 3, "vocab_size": V,
            "power_a": 0.01, "seed": 0, **kwargs}
    with pytest.raises(ConfigError, match=rf"^qgram_ar {name}=.* is not allowed: .*\.$"):
        generate_qgram_ar(**args)
