"""Fixes from the new-user picture pass (issue 28): what a picture needs so that its claim shows at the size README
shows it."""

import numpy as np
import torch

from mhalab.pictures import attention_figure


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


def test_every_heatmap_title_says_what_its_cells_are_and_fits_the_figure():
    """A title names the statistic and what it measures (prev: weight on the previous position), above the axis
    labels' size, wrapped to the figure's width."""
    from mhalab.pictures import _TITLES, stat_figure

    for stat in ["prev", "induction_score", "duplicate_token_score", "entropy_norm", "argmax_distance", "entropy"]:
        for n_heads in (1, 4):
            fig = stat_figure(torch.rand(2, n_heads), stat)
            title = fig.axes[0].title
            assert title.get_text().replace("\n", " ").startswith(stat), title.get_text()
            assert title.get_fontsize() > fig.axes[0].xaxis.label.get_fontsize()
            fig.canvas.draw()
            box = title.get_window_extent()
            assert 0 <= box.x0 and box.x1 <= fig.bbox.width, (stat, n_heads, box)
    assert _TITLES["prev"] == "prev: weight on the previous position"


def test_the_interactive_page_shows_no_statistic_that_is_zero_by_construction(tmp_path, monkeypatch):
    """`mhalab plots --html` (and the end of a run, through the same drawn_stats) leaves `next` off a causal model's
    page, as it draws no heatmap of it."""
    import json
    from types import SimpleNamespace

    from mhalab.analysis import plots

    stats = {"prev": torch.rand(1, 2), "next": torch.zeros(1, 2)}
    for causal, shown in ((True, ["prev"]), (False, ["prev", "next"])):
        module = SimpleNamespace(arch=SimpleNamespace(causal=causal, attention=SimpleNamespace(n_kv_heads=2)))
        monkeypatch.setattr(plots, "probe_example", lambda run_dir, checkpoint=None: (maps(5, causal), list("abcde"),
                                                                                     module))
        page = plots.attention_page_from_checkpoint(tmp_path / "run", tmp_path / str(causal), stats).read_text()
        data = json.loads(page.split("const D = ", 1)[1].split(";\n", 1)[0])
        assert list(data["stats"]) == shown


def test_ablation_colour_bars_say_what_the_sign_means(tmp_path):
    from mhalab.analysis.ablate import plot_heatmaps

    rows = [{"layer": 0, "index": h, "importance": 0.5, "zero_dbpb": 0.01 * h, "mean_dbpb": 0.005 * h,
             "zero_dacc": -0.01 * h, "mean_dacc": -0.005 * h} for h in range(2)]
    labels = [ax.get_ylabel() for ax in plot_heatmaps(rows, 1, 2, "bpb", tmp_path / "a.png").axes[1::2]]
    assert labels == ["normalised per layer, 0-1"] + ["bpb ablated - intact (> 0: the head helps)"] * 2
    labels = [ax.get_ylabel() for ax in plot_heatmaps(rows, 1, 2, "acc", tmp_path / "b.png").axes[1::2]]
    assert labels[1:] == ["acc ablated - intact (< 0: the head helps)"] * 2


def test_pruning_legend_counts_orders_and_checkpoints_in_words(tmp_path):
    """'random orders (10th-90th percentile, 1 x 3)' and 'mean of 1' said nothing: the legend names the number of
    random orders and, with several checkpoints, that the curves are their mean."""
    from mhalab.analysis.ablate import plot_pruning

    agg = [{"fraction": f, "random_p10": 3.6, "random_p90": 3.7, "random_bpb": 3.65, "importance_bpb": 3.62,
            "ablation_bpb": 3.63, "importance_ci95_low": 3.61, "importance_ci95_high": 3.63} for f in (0.0, 0.5, 1.0)]
    legend = [t.get_text() for t in plot_pruning(agg, "bpb", tmp_path / "p.png", "t", 1, 3).axes[0].get_legend().texts]
    assert legend == ["random orders: 10th-90th percentile of 3", "random orders (mean)", "importance order",
                      "single-head ablation order"]
    legend = [t.get_text() for t in plot_pruning(agg, "bpb", tmp_path / "q.png", "t", 2, 3).axes[0].get_legend().texts]
    assert legend[0] == "random orders: 10th-90th percentile of 6 (2 checkpoints x 3)"
    assert legend[2] == "importance order (mean of 2 checkpoints)"


def _arm(label, histories):
    from types import SimpleNamespace

    runs = [SimpleNamespace(summary=SimpleNamespace(history=h)) for h in histories]
    chosen = SimpleNamespace(runs=runs, label="-", threshold=lambda: None)
    chosen.at_stage = lambda stage: chosen  # a sweep without stages: its runs are stage "A+B", in both
    return SimpleNamespace(label=label, chosen=chosen)


def test_report_curves_of_one_validation_show_points_and_heads_title_clears_the_panels(tmp_path, monkeypatch):
    """A short sweep validates once: a line through one point draws nothing, so few validations get markers; the
    heads figure's two-line title sits above its panels' titles, and its ticks say 'runs'."""
    from mhalab.report import figures

    drawn = {}
    monkeypatch.setattr(figures, "_save", lambda fig, path: (drawn.__setitem__(path.name, fig), path)[1])
    figures.curves([_arm("attention.n_heads=1", [{"step": [100], "val/bpb": [3.8]}])], "val/bpb", tmp_path)
    assert {line.get_marker() for line in drawn["curves.png"].axes[0].get_lines()} == {"o"}
    figures.curves([_arm("a=1", [{"step": list(range(50)), "val/bpb": [1.0] * 50}])], "val/bpb", tmp_path)
    assert {line.get_marker() for line in drawn["curves.png"].axes[0].get_lines()} == {"None"}  # plain lines
    monkeypatch.setattr(figures, "head_stats", lambda cell: {"entropy_norm": (0.9, 0.5, 1.3)})
    figures.heads([_arm("attention.n_heads=1", [{}, {}]), _arm("attention.n_heads=4", [{}, {}])], tmp_path)
    fig = drawn["heads.png"]
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["n_heads=1 (2 runs)", "n_heads=4 (2 runs)"]
    fig.canvas.draw()
    # the figure's two-line title ends above the panel's own title
    assert fig._suptitle.get_window_extent().y0 > ax.title.get_window_extent().y1


def test_conversion_colours_the_mha_control_grey_as_its_title_says(tmp_path):
    """'grey: controls' in the title: the MHA control (source + extra steps) was drawn blue like the source."""
    from matplotlib.colors import to_hex

    from mhalab.analysis.convert import plot_conversion

    table = [{"arm": arm, "init": init, "stage": stage, "n": 2, "bpb": 3.8, "ci95_low": 3.7, "ci95_high": 3.9}
             for arm, init, stage in [("source (MHA)", "-", "trained"), ("source (MHA) + extra steps", "-",
                                      "same total steps"), ("converted GQA-2", "mean", "before uptraining"),
                                      ("converted GQA-2", "mean", "after uptraining")]]
    ax = plot_conversion(table, "bpb", tmp_path / "c.png", 2, "t").axes[0]
    dots = [line for line in ax.get_lines() if line.get_marker() == "o"]
    assert [to_hex(line.get_color()) for line in dots] == [to_hex(c) for c in ("C0", "C7", "C3", "C2")]
    assert "blue: source, red: converted, green: uptrained, grey: controls" in ax.get_title()
    assert {t.get_fontsize() for t in ax.get_xticklabels()} == {8}
