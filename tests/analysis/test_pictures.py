"""What each picture claims: attention maps coloured by each row's largest weight and every token labelled, GQA
maps grouped by key-value head, heatmaps on each statistic's fixed scale with units and enough decimals, and no
heatmap of a statistic that is zero by construction."""

import numpy as np
import pytest
import torch

from mhalab.pictures import (attention_figure, cell_decimals, drawn_stats, head_rows, stat_figure, stat_scale,
                             token_text)


def causal_maps(n_layers, n_heads, T):
    s = torch.randn(n_layers, n_heads, T, T).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return list(s.softmax(-1))  # n_layers x (H, T, T); row 0 is [1, 0, ...]


def panels(fig):
    return [ax for ax in fig.axes if ax.get_title().startswith("L")]


def test_maps_colour_each_row_by_its_largest_weight():
    maps = causal_maps(1, 2, 8)
    fig = attention_figure(maps, list("abcdefgh"))
    for h, ax in enumerate(panels(fig)):
        shown = torch.as_tensor(ax.images[0].get_array())  # (T, T)
        assert ax.images[0].get_clim() == (0.0, 1.0)
        assert torch.allclose(shown, maps[0][h] / maps[0][h].amax(-1, keepdim=True))
    assert "divided by its largest" in fig._suptitle.get_text()


def test_gqa_maps_are_grouped_by_key_value_head():
    assert head_rows(8, 2) == [("KV head 0", [0, 1, 2, 3]), ("KV head 1", [4, 5, 6, 7])]
    assert head_rows(16, 2) == [("KV head 0", [0, 1, 2, 3]), ("KV head 0", [4, 5, 6, 7]),
                                ("KV head 1", [8, 9, 10, 11]), ("KV head 1", [12, 13, 14, 15])]
    assert head_rows(6, 6) == [("", [0, 1, 2, 3]), ("", [4, 5])]  # MHA: rows of at most 4 panels
    fig = attention_figure(causal_maps(2, 4, 5), list("abcde"), n_kv_heads=2)
    titles = [ax.get_title() for ax in panels(fig)]
    assert titles == [f"L{l}H{h} (KV head {h // 2})" for l in range(2) for h in range(4)]
    assert fig.axes[0].get_subplotspec().get_geometry()[:2] == (4, 2)  # a row per layer and KV group


def test_tokens_are_readable_labels():
    assert token_text(" a\n") == "\u2423a\u23ce" and token_text("international") == "inter\u2026"


def test_heatmaps_use_the_statistics_fixed_scale_and_unit():
    small = torch.tensor([[0.0281, 0.0372], [0.0290, 0.0335]])  # induction-like scores
    fig = stat_figure(small, "induction_score")
    assert fig.axes[0].images[0].get_clim() == (0.0, 1.0)
    cells = [t.get_text() for t in fig.axes[0].texts]
    assert cells == ["0.0281", "0.0372", "0.0290", "0.0335"] and len(set(cells)) == 4
    distance = stat_figure(torch.tensor([[3.0, 8.3]]), "distance")
    assert "tokens" in distance.axes[0].get_title()
    assert distance.axes[0].images[0].get_clim() == pytest.approx((0.0, 8.3))
    assert stat_scale("entropy", np.array([[1.2, 2.7]]))[2] == "nats, from 0"


def test_cell_decimals_tell_cells_apart():
    assert cell_decimals(np.array([0.1, 0.5, 0.9])) == 2
    assert cell_decimals(np.array([0.011, 0.014])) == 3
    assert cell_decimals(np.array([0.5, 0.5])) == 2


def test_no_heatmap_of_next_in_a_causal_model():
    matrices = dict.fromkeys(["entropy", "prev", "next"], torch.zeros(1, 1))
    assert drawn_stats(matrices, causal=True) == ["entropy", "prev"]
    assert drawn_stats(matrices, causal=False) == ["entropy", "prev", "next"]
