"""Fixes from the new-user picture pass (issue 28): what a picture needs so that its claim shows at the size README
shows it."""

import numpy as np
import torch

from mhalab.analysis.plots import attention_figure


def maps(T, causal):
    s = torch.randn(2, T, T)
    if causal:
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return [s.softmax(-1)]  # 1 layer x (H, T, T)


def test_attention_maps_mark_the_diagonal_and_blank_the_keys_a_causal_query_cannot_see():
    """The previous-token band is told from the diagonal by a line through the diagonal's cells; a causal model's
    unseen keys are blank (masked), not the colour of a zero weight; a bidirectional model's are all drawn."""
    T = 6
    fig = attention_figure(maps(T, causal=True), list("abcdef"))
    ax = fig.axes[0]
    (line,) = ax.lines
    assert list(line.get_xdata()) == list(line.get_ydata()) == [-0.5, T - 0.5]
    shown = ax.images[0].get_array()
    assert np.array_equal(np.ma.getmaskarray(shown), np.triu(np.ones((T, T), bool), 1))
    assert "white line: the diagonal (self)" in fig._suptitle.get_text()
    assert "blank: keys a query cannot see" in fig._suptitle.get_text()
    fig = attention_figure(maps(T, causal=False), list("abcdef"))
    assert not np.ma.getmaskarray(fig.axes[0].images[0].get_array()).any()
    assert "blank" not in fig._suptitle.get_text()
