import math

import pytest
import torch
from torch import nn

from mhalab.analysis.ablate import zero_heads
from mhalab.hooks import call_hooks
from mhalab.head_statistics import (DETECTOR_NAMES, detection_patterns, detector_scores, repeated_random_tokens,
                                        STAT_NAMES, head_importance, head_similarity, head_stats, kv_group_similarity,
                                        layer_stats)


def one_hot_rows(targets, S):
    """(T, S) attention with row i one-hot on key targets[i]."""
    a = torch.zeros(len(targets), S)
    a[torch.arange(len(targets)), torch.tensor(targets)] = 1.0
    return a


def close(x, y):
    return torch.allclose(torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32), atol=1e-5)


# ---------------------------------------------------------------- head_stats


def test_keys_and_shapes():
    s = head_stats(torch.full((2, 3, 5, 5), 0.2))
    assert set(s) == set(STAT_NAMES)
    assert all(v.shape == (3,) and v.dtype == torch.float32 for v in s.values())


def test_uniform_rows():
    T = 4
    s = head_stats(torch.full((1, 1, T, T), 1 / T))
    assert close(s["entropy"], [math.log(4)])
    assert close(s["entropy_norm"], [1.0])
    assert close(s["confidence"], [0.25])
    assert close(s["distance"], [1.25])  # rows: 1.5, 1, 1, 1.5
    assert close(s["first_token"], [0.25])
    assert close(s["self"], [0.25])
    assert close(s["prev"], [3 / 16])  # row 0 has no previous key
    assert close(s["next"], [3 / 16])  # row 3 has no next key


def test_uniform_rows_with_padding_keys_and_queries():
    # example 0: 4 valid positions; example 1: 2 valid + 2 padding. Padding queries get a one-hot row that
    # would pull the entropy average down if they were counted.
    a = torch.zeros(2, 1, 4, 4)
    a[0, 0] = 0.25
    a[1, 0, :, :2] = 0.5
    a[1, 0, 2:] = one_hot_rows([0, 0], 4)
    mask = torch.tensor([[False] * 4, [False, False, True, True]])
    s = head_stats(a, mask)
    assert close(s["entropy"], [(4 * math.log(4) + 2 * math.log(2)) / 6])
    assert close(s["entropy_norm"], [1.0])  # the ln uses each row's own valid count
    assert close(s["next"], [(3 * 0.25 + 0.5 + 0.0) / 6])  # a[1, 1, 2] is padding -> 0
    unmasked = head_stats(a)  # counting the padding queries changes the value
    assert not close(unmasked["entropy"], s["entropy"])


def test_one_hot_heads():
    T = 4
    a = torch.stack([
        one_hot_rows([0, 1, 2, 3], T),  # self
        one_hot_rows([0, 0, 1, 2], T),  # previous token, row 0 on itself
        one_hot_rows([0, 0, 0, 0], T),  # first token
    ])[None]  # (1, 3, T, T)
    s = head_stats(a)
    assert close(s["entropy"], [0, 0, 0])
    assert close(s["entropy_norm"], [0, 0, 0])
    assert close(s["confidence"], [1, 1, 1])
    assert close(s["self"], [1, 0.25, 0.25])
    assert close(s["prev"], [0, 0.75, 0.25])
    assert close(s["next"], [0, 0, 0])
    assert close(s["first_token"], [0.25, 0.5, 1])
    assert close(s["distance"], [0, 0.75, 1.5])  # first token: (0 + 1 + 2 + 3) / 4
    assert close(s["argmax_distance"], [0, 0.75, 1.5])


def test_next_head():
    s = head_stats(one_hot_rows([1, 2, 3, 3], 4)[None, None])  # last row on itself
    assert close(s["next"], [0.75])
    assert close(s["self"], [0.25])


def test_mixed_rows_distance_vs_argmax():
    a = torch.tensor([[0.6, 0.4, 0.0],
                      [0.2, 0.3, 0.5],
                      [0.1, 0.5, 0.4]])[None, None]
    s = head_stats(a)
    assert close(s["distance"], [(0.4 + 0.7 + 0.7) / 3])
    assert close(s["argmax_distance"], [(0 + 1 + 1) / 3])
    assert close(s["confidence"], [(0.6 + 0.5 + 0.5) / 3])


def test_causal_entropy_norm_and_bf16():
    a = torch.tensor([[1.0, 0.0, 0.0],
                      [0.5, 0.5, 0.0],
                      [1 / 3, 1 / 3, 1 / 3]])[None, None]
    assert close(head_stats(a, causal=True)["entropy_norm"], [2 / 3])  # row 0 has one valid key -> 0
    assert close(head_stats(a)["entropy_norm"], [(0 + math.log(2) / math.log(3) + 1) / 3])
    s = head_stats(a.to(torch.bfloat16), causal=True)
    assert s["entropy"].dtype == torch.float32
    assert torch.allclose(s["entropy"], torch.tensor([(math.log(2) + math.log(3)) / 3]), atol=1e-2)


# ---------------------------------------------------------------- head_similarity


def test_head_similarity():
    T = 4
    uniform = torch.full((T, T), 1 / T)
    a = torch.stack([uniform, uniform, one_hot_rows([0, 1, 2, 3], T), one_hot_rows([1, 2, 3, 0], T)])[None]
    sim = head_similarity(a)
    assert sim.shape == (4, 4)
    assert torch.equal(sim, sim.T)
    assert close(sim.diagonal(), [0] * 4)
    assert close(sim[0, 1], 0.0)  # identical heads
    assert close(sim[2, 3], math.log(2))  # disjoint one-hot heads
    m = torch.tensor([5 / 8, 1 / 8, 1 / 8, 1 / 8])  # uniform vs one-hot: H(M) - (ln 4 + 0) / 2
    assert close(sim[0, 2], -(m * m.log()).sum() - 0.5 * math.log(4))


def test_head_similarity_skips_padding_queries():
    a = torch.stack([one_hot_rows([0, 1, 0], 3), one_hot_rows([1, 0, 0], 3)])[None]  # row 2 identical
    mask = torch.tensor([[False, False, True]])
    a[0, :, :, 2] = 0.0
    assert close(head_similarity(a, mask)[0, 1], math.log(2))
    assert close(head_similarity(a)[0, 1], 2 / 3 * math.log(2))


# ---------------------------------------------------------------- kv_group_similarity


def test_kv_group_similarity():
    sim = torch.tensor([[0.0, 0.1, 0.5, 0.6],
                        [0.1, 0.0, 0.6, 0.7],
                        [0.5, 0.6, 0.0, 0.3],
                        [0.6, 0.7, 0.3, 0.0]])
    out = kv_group_similarity(sim, n_kv_heads=2)  # groups {0, 1}, {2, 3}
    assert out["within_group_jsd"] == pytest.approx(0.2)
    assert out["between_group_jsd"] == pytest.approx(0.6)
    assert out["per_group"] == pytest.approx([0.1, 0.3])
    mha = kv_group_similarity(sim, n_kv_heads=4)
    assert math.isnan(mha["within_group_jsd"]) and mha["between_group_jsd"] == pytest.approx(2.8 / 6)
    mqa = kv_group_similarity(sim, n_kv_heads=1)
    assert math.isnan(mqa["between_group_jsd"]) and mqa["within_group_jsd"] == pytest.approx(2.8 / 6)
    with pytest.raises(ValueError):
        kv_group_similarity(sim, n_kv_heads=3)


# ---------------------------------------------------------------- head_importance


class FakeAttention(nn.Module):
    """A layer of n_heads heads whose outputs are the input's features (one per head), through hook_z."""

    def __init__(self, n_heads):
        super().__init__()
        self.n_heads, self.hook_fns = n_heads, {}

    def forward(self, x):  # (N, H) -> (N, H)
        return call_hooks(self, "z", x.view(x.shape[0], 1, self.n_heads, 1)).view(x.shape)  # hook_z: (N, 1, H, 1)


class FakeModel(nn.Module):
    """Two layers of 3 heads; example x's loss is sum over l, h of v[l, h] * g[l, h] * x[h] (g: the gates)."""

    def __init__(self, v):
        super().__init__()
        self.layers = nn.ModuleList([FakeAttention(3), FakeAttention(3)])
        self.v = nn.Parameter(torch.as_tensor(v, dtype=torch.float32))  # (2, 3)

    def attention_layers(self):
        return list(self.layers)

    def forward(self, x):  # (N, 3) -> per-example losses (N,)
        return sum((self.v[l] * layer(x)).sum(-1) for l, layer in enumerate(self.layers))


def loss_fn(model, batch):  # the batch's mean loss over the examples whose label is not -100
    return model(batch["x"])[batch["labels"] != -100].mean()


def fake_batch(rows, labels):
    return {"x": torch.tensor(rows, dtype=torch.float32), "labels": torch.tensor(labels)}


# dL(x)/dgate[l, h] = v[l, h] x[h]. The counted examples are 1, 1 and -4 in every feature (the one labelled -100
# and the all-ignored batch are left out), so I = mean |v x| = 2 |v|. (The old per-batch mean gave 2.5 |v|.)
BATCHES = [fake_batch([[1.0] * 3, [1.0] * 3], [0, 0]), fake_batch([[-4.0] * 3, [7.0] * 3], [0, -100]),
           fake_batch([[9.0] * 3], [-100])]


def test_head_importance_linear():
    model = FakeModel([[3.0, 0.0, -4.0], [0.0, 0.0, 0.0]])
    imp = head_importance(model, BATCHES, loss_fn, normalize=False)
    assert close(imp, [[6.0, 0.0, 8.0], [0.0, 0.0, 0.0]])  # head (0, 1) contributes nothing -> 0
    assert all(not layer.hook_fns for layer in model.layers)
    assert model.v.grad is None


def test_head_importance_is_per_example_whatever_the_batching():
    model = FakeModel([[3.0, 1.0, -4.0], [0.5, 2.0, -1.0]])
    rows = [[1.0, -2.0, 0.5], [-3.0, 1.0, 2.0], [0.5, 0.5, -1.0], [2.0, -1.0, -2.0]]
    one = head_importance(model, [fake_batch(rows, [0] * 4)], loss_fn, normalize=False)
    singles = head_importance(model, [fake_batch([r], [0]) for r in rows], loss_fn, normalize=False)
    expected = model.v.detach().abs() * torch.tensor(rows).abs().mean(0)  # mean |v x| over the four examples
    assert close(one, expected) and close(singles, expected)


def test_head_importance_of_a_gated_off_head_is_zero():
    model = FakeModel([[3.0, 1.0, -4.0], [0.5, 2.0, -1.0]])
    with zero_heads(model, [(0, 1)]):
        imp = head_importance(model, BATCHES, loss_fn, normalize=False)
    assert close(imp, [[6.0, 0.0, 8.0], [1.0, 4.0, 2.0]])
    assert all(not layer.hook_fns for layer in model.layers)


def test_head_importance_normalized():
    model = FakeModel([[3.0, 0.0, -4.0], [1.0, 2.0, 2.0]])
    imp = head_importance(model, BATCHES, loss_fn)
    assert close(imp, [[0.6, 0.0, 0.8], [1 / 3, 2 / 3, 2 / 3]])
    assert close(imp.norm(dim=-1), [1.0, 1.0])
    zero = head_importance(FakeModel(torch.zeros(2, 3)), BATCHES, loss_fn)  # no divide-by-zero
    assert torch.equal(zero, torch.zeros(2, 3))


def test_head_importance_needs_a_predicted_example():
    with pytest.raises(ValueError, match="at least one example"):
        head_importance(FakeModel(torch.ones(2, 3)), [fake_batch([[1.0] * 3], [-100])], loss_fn)


def test_head_importance_restores_on_error():
    model = FakeModel(torch.ones(2, 3))

    def bad_loss(model, batch):
        model(batch["x"])
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        head_importance(model, BATCHES, bad_loss)
    assert all(not layer.hook_fns for layer in model.layers)


# ---------------------------------------------------------------- tables


def test_layer_stats_are_layer_by_head_matrices_matching_head_stats():
    torch.manual_seed(0)
    weights = [torch.softmax(torch.randn(2, 4, 6, 6), -1) for _ in range(3)]  # 3 layers x (B, H, T, T)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 4:] = True
    stats, groups = layer_stats(weights, pad, causal=False, n_kv_heads=2)
    assert set(stats) == set(STAT_NAMES) and all(v.shape == (3, 4) for v in stats.values())
    for layer, w in enumerate(weights):
        assert torch.allclose(stats["entropy"][layer], head_stats(w, pad)["entropy"])
    assert groups["within_group_jsd"].shape == (3,) and groups["between_group_jsd"].shape == (3,)


# ---------------------------------------------------------------- head detectors


def test_detector_scores_of_ideal_heads():
    """A head attending exactly where a detection pattern points gets the share of queries that have a target."""
    half, T = 5, 10
    ids = repeated_random_tokens(torch.arange(100, 200), 3, half, seed=1)  # (3, 10)
    assert torch.equal(ids[:, :half], ids[:, half:]) and all(len(set(r.tolist())) == half for r in ids)
    det = detection_patterns(ids)
    self_attn = torch.eye(T).expand(3, T, T)
    ideal = [torch.where(det[k].any(-1, keepdim=True), det[k].float(), self_attn) for k in DETECTOR_NAMES]
    ideal = [p / p.sum(-1, keepdim=True) for p in ideal]  # rows with nothing to find attend to themselves
    scores = detector_scores([torch.stack(ideal, 1)], ids)  # one layer, 3 heads: prev, duplicate, induction
    assert set(scores) == set(DETECTOR_NAMES) and scores["induction_score"].shape == (1, 3)
    assert scores["prev_token_score"][0].tolist() == pytest.approx([(T - 1) / T, 0.0, 0.0])
    assert scores["duplicate_token_score"][0].tolist() == pytest.approx([0.0, half / T, 0.0])
    assert scores["induction_score"][0].tolist() == pytest.approx([0.0, 0.0, half / T])
