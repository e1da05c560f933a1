"""Multi-query associative recall (MQAR; Arora et al. 2023, "Zoology"), generated locally and deterministically.

Follows ``multiquery_ar`` in HazyResearch/zoology ``zoology/data/multiquery_ar.py`` (called
``associative_recall.py`` before commit dbcb60d; read at d88d6f5, ``num_passes=1``).  In MQAR ids
(``V = vocab_size``, ``n = n_kv_pairs``, ``L = seq_len``, ``C = 2n``) one example is::

    positions 0 .. C-1   k_1 v_1 k_2 v_2 ... k_n v_n      keys distinct from 1 .. V//2 - 1,
                                                           values distinct from V//2 .. V - 1
    positions C .. L-1   S = (L - C) / 2 two-token slots;   key k_i is repeated as a query at C + 2 s_i
    labels               labels[C + 2 s_i] = v_i, every other label is -100

The slots s_1..s_n are distinct, drawn one after another without replacement with
p(s) ∝ (s + 1) ** (power_a - 1), s = 0 .. S-1 (Zoology's ``np.random.choice(..., replace=False, p=p)``;
key i gets the i-th draw, so early keys tend to be queried early).  Every other position is filler,
uniform over all V ids (so filler can repeat a key or a value; only query positions carry labels).

Label alignment (causal model): ``labels[t]`` is scored against the logits at position t, which has
seen ``input_ids[:t+1]``: the label of a query sits on the query key itself, and the model predicts the
key's value as the "next token".  Zoology builds a sequence of L + 1 tokens and returns
``inputs = seq[:-1]``, ``labels = next[1:]``; the result is exactly this alignment.  The labels are
therefore already shifted: a collator must pass them through, not shift again like mhalab's CLM one.

Ids: mhalab reserves ids 0-4 for ``[PAD] [UNK] [CLS] [SEP] [MASK]`` (``tokenization.N_SPECIAL``), so
every MQAR id m is stored as ``m + ID_OFFSET``; the model needs ``model_vocab_size(V) = V + 5`` rows and
padding (id 0) never collides with a key, value or filler.  MQAR id 0, which Zoology never uses as a
key or value, is a filler-only id (model id 5).

Splits: ``generate_mqar_splits`` draws train/validation/test from three seeds spawned from one seed
(``split_seeds``), as Zoology draws train and test segments from different seeds.  Nothing removes an
example that occurs in two splits; with random filler a repeat is practically impossible
(``overlap_fraction`` measures it; see docs/tasks.md).

Differences from Zoology (same distribution otherwise):
- numpy ``Generator`` (``default_rng(seed)``) instead of the global ``np.random.seed`` + ``torch.randint``
  for the filler, so the filler is seeded too; slots use the Gumbel-top-k trick, which is the same
  sequential without-replacement law as Zoology's ``choice(replace=False, p=p)`` but vectorised.
- ids offset by 5 (above); int32 inputs and int64 labels as numpy arrays, not torch tensors.
- Zoology's ``assert vocab_size > input_seq_len`` is dropped: nothing in the construction needs it; the
  real limits (``seq_len >= 4 n``, ``V // 2 - 1 >= n``) are checked and raise ``ConfigError``.
- ``num_passes`` (JRT repetition of the context) is not implemented.
"""

from __future__ import annotations

import math

import numpy as np

from mhalab.errors import ConfigError

ID_OFFSET = 5  # == mhalab.data.tokenization.N_SPECIAL (a test checks it); kept literal to stay torch-free
IGNORE_INDEX = -100
SPLITS = ("train", "validation", "test")
_CHUNK = 1 << 22  # elements per temporary (rows x width) float array


def model_vocab_size(vocab_size: int) -> int:
    """Rows the model's embedding needs for MQAR ids 0 .. vocab_size-1 after the offset."""
    return int(vocab_size) + ID_OFFSET


def check_int(task: str, name: str, value, low: int, high: int | None = None, why: str = "") -> int:
    """``value`` as an int in [low, high], else ConfigError naming ``task`` and ``name``."""
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if not ok or value < low or (high is not None and value > high):
        allowed = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"
        raise ConfigError(f"{task} {name}={value!r} is not allowed: {name} must be {allowed}{why}.")
    return int(value)


def check_power(task: str, power_a) -> float:
    """``power_a`` as a finite float > 0, else ConfigError."""
    ok = isinstance(power_a, (int, float, np.integer, np.floating)) and not isinstance(power_a, bool)
    if not ok or not math.isfinite(power_a) or power_a <= 0:
        raise ConfigError(f"{task} power_a={power_a!r} is not allowed: power_a must be a finite number > 0 "
                          "(Zoology uses 0.01; 1 gives uniform query slots).")
    return float(power_a)


def _rows_per_chunk(width: int) -> int:
    return max(1, _CHUNK // max(1, width))


def _has_repeat(a: np.ndarray) -> np.ndarray:
    """(rows,) bool: does row r of the (rows, k) int array repeat a value?"""
    s = np.sort(a, axis=1)
    return (s[:, 1:] == s[:, :-1]).any(axis=1)


def sample_distinct(rng: np.random.Generator, n_rows: int, population: int, k: int) -> np.ndarray:
    """(n_rows, k) int64: each row k distinct ints from [0, population), a uniformly random ordered k-subset."""
    if k * (k - 1) <= population:  # whole-row rejection: P(row has no repeat) >= 1/2
        out = rng.integers(0, population, size=(n_rows, k))  # (n_rows, k)
        redo = np.flatnonzero(_has_repeat(out))
        while redo.size:
            out[redo] = rng.integers(0, population, size=(redo.size, k))
            redo = redo[_has_repeat(out[redo])]
        return out
    step = _rows_per_chunk(population)  # population < k^2: a random permutation per row is cheap
    parts = [np.argsort(rng.random((min(step, n_rows - i), population)), axis=1)[:, :k]
             for i in range(0, n_rows, step)]  # each (rows, k)
    return np.concatenate(parts) if parts else np.zeros((0, k), dtype=np.int64)


def power_law_slots(rng: np.random.Generator, n_rows: int, n_slots: int, k: int, power_a: float) -> np.ndarray:
    """(n_rows, k) int64: k distinct slots of 0..n_slots-1 per row, drawn in order without replacement with
    p(s) ∝ (s + 1) ** (power_a - 1) (Gumbel-top-k: the ordered top k of log p + Gumbel noise)."""
    log_p = (power_a - 1.0) * np.log(np.arange(1, n_slots + 1, dtype=np.float64))  # (n_slots,)
    step = _rows_per_chunk(n_slots)
    parts = [np.argsort(-(log_p + rng.gumbel(size=(min(step, n_rows - i), n_slots))), axis=1)[:, :k]
             for i in range(0, n_rows, step)]  # each (rows, k)
    return np.concatenate(parts) if parts else np.zeros((0, k), dtype=np.int64)


def check_mqar(n_examples, seq_len, n_kv_pairs, vocab_size, power_a, seed) -> None:
    """Raise ConfigError for the first argument ``generate_mqar`` cannot use."""
    check_int("mqar", "n_examples", n_examples, 0)
    check_int("mqar", "seq_len", seq_len, 4)
    if seq_len % 2:
        raise ConfigError(f"mqar seq_len={seq_len} is not allowed: seq_len must be even (key/filler slots of 2).")
    check_int("mqar", "n_kv_pairs", n_kv_pairs, 1, seq_len // 4,
              f" (seq_len // 4 with seq_len={seq_len}: context and queries take 2 tokens per pair each)")
    check_int("mqar", "vocab_size", vocab_size, 2 * n_kv_pairs + 2,
              why=f" (2 * n_kv_pairs + 2, so that ids 1 .. vocab_size//2 - 1 hold {n_kv_pairs} distinct keys)")
    check_power("mqar", power_a)
    check_int("mqar", "seed", seed, 0)


def generate_mqar(n_examples: int, seq_len: int, n_kv_pairs: int, vocab_size: int, power_a: float = 0.01,
                  seed: int = 0, random_non_queries: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``n_examples`` MQAR sequences: (input_ids int32 (n, seq_len), labels int64 (n, seq_len)).

    Model ids = MQAR ids + 5; labels hold the value's model id at query positions and -100 elsewhere.
    The arrays are drawn as a whole: the same seed with another ``n_examples`` gives other examples.
    ``random_non_queries=False`` puts filler MQAR id 0 (model id 5) everywhere instead of random ids.
    """
    check_mqar(n_examples, seq_len, n_kv_pairs, vocab_size, power_a, seed)
    n, L, P, V = int(n_examples), int(seq_len), int(n_kv_pairs), int(vocab_size)
    C = 2 * P  # context length
    rng = np.random.default_rng(seed)
    keys = 1 + sample_distinct(rng, n, V // 2 - 1, P)  # (n, P) in 1 .. V//2-1
    values = V // 2 + sample_distinct(rng, n, V - V // 2, P)  # (n, P) in V//2 .. V-1
    slots = power_law_slots(rng, n, (L - C) // 2, P, power_a)  # (n, P): query slot of key i
    ids = rng.integers(0, V, size=(n, L)) if random_non_queries else np.zeros((n, L), dtype=np.int64)  # (n, L)
    ids[:, 0:C:2] = keys
    ids[:, 1:C:2] = values
    query_pos = C + 2 * slots  # (n, P)
    np.put_along_axis(ids, query_pos, keys, axis=1)
    labels = np.full((n, L), IGNORE_INDEX, dtype=np.int64)  # (n, L)
    np.put_along_axis(labels, query_pos, values + ID_OFFSET, axis=1)
    return (ids + ID_OFFSET).astype(np.int32), labels


def split_seeds(seed: int) -> dict[str, int]:
    """Three different seeds for train/validation/test, spawned from one seed (numpy SeedSequence)."""
    check_int("split", "seed", seed, 0)
    children = np.random.SeedSequence(int(seed)).spawn(len(SPLITS))
    return {name: int(c.generate_state(1, dtype=np.uint64)[0]) for name, c in zip(SPLITS, children)}


def generate_mqar_splits(n_train: int, n_val: int, n_test: int, seq_len: int, n_kv_pairs: int, vocab_size: int,
                         power_a: float = 0.01, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{"train" | "validation" | "test": (input_ids, labels)}, each split from its own seed (``split_seeds``)."""
    seeds = split_seeds(seed)
    sizes = dict(zip(SPLITS, (n_train, n_val, n_test)))
    return {s: generate_mqar(sizes[s], seq_len, n_kv_pairs, vocab_size, power_a, seeds[s]) for s in SPLITS}


def chance_accuracy(vocab_size: int) -> float:
    """Expected accuracy of the best predictor that ignores the context: values are uniform over the
    ``vocab_size - vocab_size // 2`` value ids whatever the query key, so any fixed guess gets 1/that."""
    return 1.0 / (int(vocab_size) - int(vocab_size) // 2)


def majority_accuracy(train_labels: np.ndarray, eval_labels: np.ndarray) -> float:
    """Accuracy on ``eval_labels`` of always predicting the most frequent label of ``train_labels``
    (-100 ignored in both): the measured context-free baseline, ~``chance_accuracy``."""
    train, ev = train_labels[train_labels != IGNORE_INDEX], eval_labels[eval_labels != IGNORE_INDEX]
    if train.size == 0 or ev.size == 0:
        raise ValueError("majority_accuracy needs at least one label in each array")
    return float(np.mean(ev == np.bincount(train).argmax()))


def overlap_fraction(a: np.ndarray, b: np.ndarray) -> float:
    """Fraction of the rows of ``b`` that also occur as rows of ``a`` (e.g. test sequences seen in training;
    pass ``a[:, :2 * n_kv_pairs]`` to compare only the key-value contexts)."""
    seen = {row.tobytes() for row in np.ascontiguousarray(a)}
    rows = np.ascontiguousarray(b, dtype=a.dtype)
    return float(np.mean([row.tobytes() in seen for row in rows])) if len(rows) else 0.0
