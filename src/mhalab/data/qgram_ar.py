"""q-gram associative recall: MQAR whose keys are q tokens long, so one position must gather q tokens.

Zoology's MQAR (``mhalab.data.mqar``) with every key a q-tuple (``key_len`` = q) over a small per-example
alphabet.  In MQAR ids (``V = vocab_size``, ``n = n_kv_pairs``, ``R = q + 1``, ``C = n R``)::

    positions 0 .. C-1   a_1 .. a_q v | a_1 .. a_q v | ...    n records: a q-token key, then its value
    positions C .. L-1   S = (L - C) // R slots of R tokens;   key i is repeated as a query in slot s_i,
                                                               at C + s_i R .. C + s_i R + q - 1
    labels               on the query's last key token: labels[C + s_i R + q - 1] = v_i, else -100

Keys: each example draws ``n_key_tokens`` (g) distinct key ids from 1 .. V//2 - 1, then n distinct
ordered tuples uniformly from all g^q tuples over them (repeats inside a tuple allowed).  With n = g^q
(the full grid) no proper part of a key identifies it: any q - 1 of its positions, or its multiset
of tokens (AB vs BA), is shared with other keys.  Values, slots (power law in ``power_a``), filler
and the id offset (+5, see ``mqar.ID_OFFSET``) are exactly MQAR's; q = 1 with g = n *is* MQAR.

Why heads should matter (docs/tasks.md): with the two layers MQAR needs, layer 1 must bring the q
key tokens of a record into its value position (lags 1..q) and the query's q - 1 earlier tokens into
its last token.  q heads can each copy one lag (Svete & Cotterell 2024); one head returns a single
softmax average of q tokens, which is order-blind when uniform and otherwise needs a wide head and
precise unequal weights (Sanford et al. 2023: width must grow with the number of positions averaged).
``partial_key_accuracy`` gives the accuracy ceiling of a model that matches only part of the key.

Generalises Zoology's ``compositional_mqar`` (q = 2, full grid, K1 and K2 from disjoint thirds of the
vocabulary): here every key position shares one alphabet, so the multiset of a key does not identify
it, q and n are free, and the layout mirrors MQAR (slots of q + 1 tokens instead of 3).
"""

from __future__ import annotations

import numpy as np

from mhalab.data.mqar import (ID_OFFSET, IGNORE_INDEX, SPLITS, check_int, check_power, power_law_slots,
                              sample_distinct, split_seeds)
from mhalab.errors import ConfigError

TASK = "qgram_ar"


def check_qgram_ar(n_examples, seq_len, n_kv_pairs, key_len, n_key_tokens, vocab_size, power_a, seed) -> None:
    """Raise ConfigError for the first argument ``generate_qgram_ar`` cannot use."""
    check_int(TASK, "n_examples", n_examples, 0)
    check_int(TASK, "key_len", key_len, 1)
    check_int(TASK, "seq_len", seq_len, 2 * (key_len + 1),
              why=f" (2 * (key_len + 1) with key_len={key_len}: one record and one query slot)")
    check_int(TASK, "vocab_size", vocab_size, 4, why=" (ids 1 .. vocab_size//2 - 1 are the key ids)")
    check_int(TASK, "n_key_tokens", n_key_tokens, 1, vocab_size // 2 - 1,
              f" (vocab_size // 2 - 1 = the number of key ids for vocab_size={vocab_size})")
    if key_len * np.log2(max(n_key_tokens, 1)) >= 62:
        raise ConfigError(f"{TASK} key_len={key_len} is not allowed: with n_key_tokens={n_key_tokens}, key_len "
                          "must keep n_key_tokens ** key_len below 2**62.")
    bounds = (n_key_tokens ** key_len, seq_len // (2 * (key_len + 1)), vocab_size - vocab_size // 2)
    check_int(TASK, "n_kv_pairs", n_kv_pairs, 1, min(bounds),
              f" (the least of n_key_tokens ** key_len = {bounds[0]} keys, seq_len // (2 * (key_len + 1)) = "
              f"{bounds[1]} records with query slots and vocab_size - vocab_size // 2 = {bounds[2]} values)")
    check_power(TASK, power_a)
    check_int(TASK, "seed", seed, 0)


def generate_qgram_ar(n_examples: int, seq_len: int, n_kv_pairs: int, key_len: int, n_key_tokens: int,
                      vocab_size: int, power_a: float = 0.01, seed: int = 0,
                      random_non_queries: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``n_examples`` sequences: (input_ids int32 (n, seq_len), labels int64 (n, seq_len)), ids offset by 5.

    Labels are aligned with the logits (``labels[t]`` is predicted at position t, on the query's last
    key token); -100 everywhere else.  ``random_non_queries=False`` fills with MQAR id 0 (model id 5).
    """
    check_qgram_ar(n_examples, seq_len, n_kv_pairs, key_len, n_key_tokens, vocab_size, power_a, seed)
    n, L, P, q, g, V = map(int, (n_examples, seq_len, n_kv_pairs, key_len, n_key_tokens, vocab_size))
    R, C = q + 1, P * (q + 1)  # record / slot length, context length
    rng = np.random.default_rng(seed)
    alphabet = 1 + sample_distinct(rng, n, V // 2 - 1, g)  # (n, g) key ids of each example
    tuples = sample_distinct(rng, n, g ** q, P)  # (n, P) distinct tuple indices in [0, g^q)
    digits = (tuples[:, :, None] // g ** np.arange(q - 1, -1, -1)) % g  # (n, P, q) base-g digits
    keys = np.take_along_axis(alphabet, digits.reshape(n, P * q), axis=1).reshape(n, P, q)  # (n, P, q)
    values = V // 2 + sample_distinct(rng, n, V - V // 2, P)  # (n, P)
    slots = power_law_slots(rng, n, (L - C) // R, P, power_a)  # (n, P)
    ids = rng.integers(0, V, size=(n, L)) if random_non_queries else np.zeros((n, L), dtype=np.int64)  # (n, L)
    ids[:, :C] = np.concatenate([keys, values[:, :, None]], axis=2).reshape(n, C)
    query_pos = C + slots[:, :, None] * R + np.arange(q)  # (n, P, q)
    np.put_along_axis(ids, query_pos.reshape(n, P * q), keys.reshape(n, P * q), axis=1)
    labels = np.full((n, L), IGNORE_INDEX, dtype=np.int64)  # (n, L)
    np.put_along_axis(labels, query_pos[:, :, -1], values + ID_OFFSET, axis=1)
    return (ids + ID_OFFSET).astype(np.int32), labels


def generate_qgram_ar_splits(n_train: int, n_val: int, n_test: int, seq_len: int, n_kv_pairs: int, key_len: int,
                             n_key_tokens: int, vocab_size: int, power_a: float = 0.01,
                             seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{"train" | "validation" | "test": (input_ids, labels)}, each split from its own seed (``split_seeds``)."""
    seeds = split_seeds(seed)
    sizes = dict(zip(SPLITS, (n_train, n_val, n_test)))
    return {s: generate_qgram_ar(sizes[s], seq_len, n_kv_pairs, key_len, n_key_tokens, vocab_size, power_a,
                                 seeds[s]) for s in SPLITS}


def context_keys(input_ids: np.ndarray, n_kv_pairs: int, key_len: int) -> np.ndarray:
    """(n, n_kv_pairs, key_len): the keys of each example's context records, in context order."""
    R = key_len + 1
    return input_ids[:, : n_kv_pairs * R].reshape(len(input_ids), n_kv_pairs, R)[:, :, :key_len]


def partial_key_accuracy(input_ids: np.ndarray, n_kv_pairs: int, key_len: int, last: int | None = None,
                         order_blind: bool = False) -> float:
    """Accuracy of an ideal recaller that sees only part of each query key and guesses uniformly among the
    context keys that agree with that part: only the ``last`` tokens of the key, or (``order_blind``) its
    multiset of tokens.  Every context key is queried once, so this is the mean of 1 / (#agreeing keys).
    ``last=key_len - 1`` is a model whose layer 1 copies one lag too few; ``order_blind`` one that averages."""
    keys = context_keys(input_ids, n_kv_pairs, key_len)  # (n, P, q)
    if last is not None:
        keys = keys[:, :, key_len - last:] if last > 0 else keys[:, :, :0]
    if order_blind:
        keys = np.sort(keys, axis=2)
    agree = (keys[:, :, None, :] == keys[:, None, :, :]).all(axis=3)  # (n, P, P)
    return float(np.mean(1.0 / agree.sum(axis=2)))
