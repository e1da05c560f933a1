"""Ablation and conversion pictures scaled to their effects, never drawing an interval from one run."""

import pytest

from mhalab.analysis.ablate import plot_heatmaps
from mhalab.analysis.convert import plot_conversion


def rows(effects):
    return [{"layer": l, "index": h, "importance": 0.5, "zero_dloss": effects[l][h], "mean_dloss": effects[l][h] / 2}
            for l in range(len(effects)) for h in range(len(effects[0]))]


def test_ablation_scale_fits_small_effects(tmp_path):
    small = [[0.01, -0.012, 0.008, 0.004], [0.011, -0.003, 0.009, 0.006]]
    fig = plot_heatmaps(rows(small), 2, 4, "loss", tmp_path / "a.png")
    assert fig.axes[2].images[0].get_clim() == pytest.approx((-0.012, 0.012))  # not ±1
    one_big = [[0.01, -0.012, 0.008, 0.004], [0.9, -0.003, 0.009, 0.006]]
    fig = plot_heatmaps(rows(one_big), 2, 4, "loss", tmp_path / "b.png")
    lo, hi = fig.axes[2].images[0].get_clim()
    assert hi < 0.1 and lo == -hi and "clipped" in fig.axes[2].get_title()  # the one big head does not hide the rest
    assert "0.9" in [t.get_text() for t in fig.axes[2].texts]  # its value is printed


def arm(arm, stage, n, y, lo=None, hi=None):
    return {"arm": arm, "init": "-", "stage": stage, "n": n, "acc": y, "ci95_low": lo, "ci95_high": hi}


def test_conversion_draws_no_interval_from_one_run(tmp_path):
    fig = plot_conversion([arm("MHA source", "source", 1, 0.91), arm("GQA mean", "before uptraining", 1, 0.80)],
                          "acc", tmp_path / "c.png", 2, "mqar")
    ax = fig.axes[0]
    assert "one source run: no interval" in ax.get_title()
    assert not [c for c in ax.collections if c.get_segments()]  # no error bars
    lo, hi = ax.get_ylim()
    assert lo > 0.5  # fitted to the arms, not from 0
    fig = plot_conversion([arm("MHA source", "source", 3, 0.91, 0.90, 0.92)], "acc", tmp_path / "d.png", 2, "mqar")
    assert "over 3 source seeds" in fig.axes[0].get_title()
    assert [c for c in fig.axes[0].collections if c.get_segments()]
