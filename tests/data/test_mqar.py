"""MQAR generator: layout, Zoology's query-slot law, determinism, validation and the chance baseline."""

import numpy as np
import pytest

from mhalab.data import mqar
from mhalab.data.mqar import (ID_OFFSET, IGNORE_INDEX, chance_accuracy, generate_mqar, generate_mqar_splits,
                              majority_accuracy, model_vocab_size, overlap_fraction, split_seeds)
from mhalab.errors import ConfigError

V, L, P = 64, 32, 4  # small MQAR: 31 key ids, 32 value ids, 12 query slots


def check_layout(ids, labels, n_kv_pairs, vocab_size):
    """Every structural promise of the module docstring, per example; returns each key's query position."""
    n, seq_len = ids.shape
    C, half = 2 * n_kv_pairs, vocab_size // 2
    assert ids.dtype == np.int32 and labels.dtype == np.int64 and labels.shape == (n, seq_len)
    assert ids.min() >= ID_OFFSET and ids.max() < vocab_size + ID_OFFSET  # pad and specials never used
    keys, values = ids[:, 0:C:2] - ID_OFFSET, ids[:, 1:C:2] - ID_OFFSET  # (n, P) MQAR ids
    assert ((keys >= 1) & (keys < half)).all() and ((values >= half) & (values < vocab_size)).all()
    query_pos = np.empty_like(keys)
    for r in range(n):
        assert len(set(keys[r])) == n_kv_pairs and len(set(values[r])) == n_kv_pairs  # each key once
        pos = np.flatnonzero(labels[r] != IGNORE_INDEX)
        assert len(pos) == n_kv_pairs and (pos >= C).all() and ((pos - C) % 2 == 0).all()
        for p in pos:  # the query is a context key and its label is that key's value
            (i,) = np.flatnonzero(keys[r] == ids[r, p] - ID_OFFSET)
            assert labels[r, p] == values[r, i] + ID_OFFSET
            query_pos[r, i] = p
        assert len(set(query_pos[r])) == n_kv_pairs  # every key is queried exactly once
    return query_pos


@pytest.mark.parametrize("random_non_queries", [True, False])
def test_layout(random_non_queries):
    ids, labels = generate_mqar(300, L, P, V, seed=3, random_non_queries=random_non_queries)
    assert ids.shape == (300, L)
    query_pos = check_layout(ids, labels, P, V)
    filler = np.ones(ids.shape, bool)
    filler[:, : 2 * P] = False
    np.put_along_axis(filler, query_pos, False, axis=1)
    if random_non_queries:  # Zoology: filler uniform over all MQAR ids, keys and values included
        f = ids[filler] - ID_OFFSET
        assert f.min() == 0 and f.max() == V - 1 and 0.45 < np.mean(f < V // 2) < 0.55
    else:
        assert (ids[filler] == ID_OFFSET).all()


def test_largest_pair_count_and_small_vocab():
    """n_kv_pairs = seq_len / 4 fills every query slot; vocab_size = 2n + 2 uses every key id."""
    ids, labels = generate_mqar(50, 16, 4, 10, seed=0)
    check_layout(ids, labels, 4, 10)
    assert (labels[:, 8::2] != IGNORE_INDEX).all()
    assert (np.sort(ids[:, 0:8:2], axis=1) - ID_OFFSET == [1, 2, 3, 4]).all()


def slot_counts(power_a, n, n_kv_pairs, key=0):
    ids, labels = generate_mqar(n, L, n_kv_pairs, V, power_a=power_a, seed=11)
    slots = (check_layout(ids, labels, n_kv_pairs, V) - 2 * n_kv_pairs) // 2  # (n, P)
    return np.bincount(slots[:, key], minlength=(L - 2 * n_kv_pairs) // 2)


def assert_follows(counts, p):
    """Each bin within 5 binomial standard deviations (+1) of its expected count."""
    n = counts.sum()
    assert np.all(np.abs(counts - n * p) <= 5 * np.sqrt(n * p * (1 - p)) + 1), (counts, np.round(n * p))


def power_law(n_slots, power_a):
    p = np.arange(1, n_slots + 1) ** (power_a - 1.0)
    return p / p.sum()


@pytest.mark.parametrize("power_a", [0.01, 0.5, 1.0])
def test_query_slots_follow_power_law(power_a):
    assert_follows(slot_counts(power_a, 4000, 1), power_law(L // 2 - 1, power_a))  # one pair: one draw from p
    assert_follows(slot_counts(power_a, 4000, P), power_law(L // 2 - P, power_a))  # key 1 gets the first draw


def test_second_draw_is_sequential_without_replacement_like_zoology():
    """Key 2's slot has the law of a second draw from p without replacement, sum_i p_i p_j / (1 - p_i),
    which is also what Zoology's np.random.choice(replace=False, p=p) gives."""
    S = L // 2 - P
    p = power_law(S, 0.01)
    second = np.array([sum(p[i] * p[j] / (1 - p[i]) for i in range(S) if i != j) for j in range(S)])
    assert_follows(slot_counts(0.01, 4000, P, key=1), second)
    legacy = np.random.RandomState(0)
    zoology = np.bincount([legacy.choice(S, size=P, replace=False, p=p)[1] for _ in range(4000)], minlength=S)
    assert_follows(zoology, second)


def test_deterministic_from_seed():
    a = generate_mqar(100, L, P, V, seed=5)
    b = generate_mqar(100, L, P, V, seed=5)
    c = generate_mqar(100, L, P, V, seed=6)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[0], c[0]) and not np.array_equal(a[1], c[1])


def test_splits_use_different_seeds():
    seeds = split_seeds(0)
    assert set(seeds) == {"train", "validation", "test"} and len(set(seeds.values())) == 3
    assert seeds == split_seeds(0) and seeds != split_seeds(1)
    splits = generate_mqar_splits(200, 50, 60, L, P, V, seed=0)
    assert [len(splits[s][0]) for s in ("train", "validation", "test")] == [200, 50, 60]
    assert np.array_equal(splits["test"][0], generate_mqar(60, L, P, V, seed=seeds["test"])[0])
    assert overlap_fraction(splits["train"][0], splits["test"][0]) == 0.0


def test_overlap_fraction():
    a = np.arange(12).reshape(4, 3)
    assert overlap_fraction(a, a) == 1.0
    assert overlap_fraction(a, a[[0, 2]] + 100) == 0.0
    assert overlap_fraction(a, np.stack([a[1], a[1] + 1])) == 0.5


def test_chance_baseline():
    assert chance_accuracy(V) == 1 / 32 and chance_accuracy(9) == 1 / 5
    train, test = generate_mqar_splits(3000, 0, 1000, L, P, V, seed=1)["train"], generate_mqar(1000, L, P, V, seed=9)
    acc = majority_accuracy(train[1], test[1])
    assert acc < 3 * chance_accuracy(V)  # ~1/32: values do not depend on the key across examples


def test_offset_matches_tokenizers():
    from mhalab.data.tokenization import N_SPECIAL, PAD_ID

    assert ID_OFFSET == N_SPECIAL and PAD_ID < ID_OFFSET and model_vocab_size(V) == V + N_SPECIAL


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"n_examples": -1}, "n_examples"),
        ({"n_examples": 2.0}, "n_examples"),
        ({"seq_len": 31}, "seq_len"),
        ({"seq_len": 2}, "seq_len"),
        ({"n_kv_pairs": 9}, "n_kv_pairs"),  # 2 * 9 context + 2 * 9 query tokens > 32
        ({"n_kv_pairs": 0}, "n_kv_pairs"),
        ({"n_kv_pairs": True}, "n_kv_pairs"),
        ({"vocab_size": 9}, "vocab_size"),  # key ids 1..3 cannot hold 4 distinct keys
        ({"power_a": 0.0}, "power_a"),
        ({"power_a": float("nan")}, "power_a"),
        ({"seed": -1}, "seed"),
    ],
)
def test_validation(kwargs, name):
    args = {"n_examples": 10, "seq_len": L, "n_kv_pairs": P, "vocab_size": V, "power_a": 0.01, "seed": 0, **kwargs}
    with pytest.raises(ConfigError, match=rf"^mqar {name}=.* is not allowed: {name} must be .*\.$"):
        generate_mqar(**args)


def test_large_sizes_are_vectorised():
    """Zoology's largest pair count at a reduced example count: seconds, not minutes."""
    ids, labels = generate_mqar(2000, 256, 64, 8192, seed=0)
    check_layout(ids[:20], labels[:20], 64, 8192)
    assert (labels != IGNORE_INDEX).sum() == 2000 * 64


@pytest.mark.parametrize("population, k", [(3, 3), (40, 5)])  # permutation branch, rejection branch
def test_sample_distinct_is_uniform(population, k):
    rows = mqar.sample_distinct(np.random.default_rng(0), 6000, population, k)
    assert rows.shape == (6000, k) and rows.min() >= 0 and rows.max() < population
    assert all(len(set(r)) == k for r in rows)
    for j in range(k):  # every position is uniform over the population
        assert_follows(np.bincount(rows[:, j], minlength=population), np.full(population, 1 / population))
