"""The report's pictures say what they draw: the interval is named, every reference line has a label, legends
read without config groups or '(-)'; report.html links each run's interactive attention page."""

import importlib.util
from pathlib import Path

import pytest

from mhalab.report.command import report
from mhalab.report.figures import INTERVAL



def _tests(name: str):
    """A sibling test module, for its helpers that write runs."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


report_tests = _tests("test_report")


def test_final_figure_names_its_interval_and_reference_lines(tmp_path, monkeypatch):
    from mhalab.report import figures

    drawn = {}
    save = figures._save
    monkeypatch.setattr(figures, "_save", lambda fig, path: drawn.setdefault(path.name, fig) and save(fig, path))
    report_tests.write_sweep(tmp_path / "sweep")
    (tmp_path / "sweep" / "0" / "plots").mkdir()
    (tmp_path / "sweep" / "0" / "plots" / "attention.html").write_text("<html></html>")
    report([tmp_path / "sweep"], baseline="attention.n_kv_heads=8")
    ax = drawn["final.png"].axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert f"mean and {INTERVAL}" in labels
    assert "chance acc: 0.0312" in labels and "majority acc: 0.04" in labels  # every reference line labelled
    assert len([line for line in ax.get_lines() if line.get_linestyle() != "None" and len(line.get_xdata()) == 2
                and line.get_xdata()[0] == 0 and line.get_xdata()[1] == 1]) == 2
    assert all("(-)" not in t.get_text() and "attention." not in t.get_text() for t in ax.get_xticklabels())
    page = (tmp_path / "sweep" / "report" / "report.html").read_text()
    assert "href='../0/plots/attention.html'" in page


def test_the_comparison_table_names_an_untuned_arm_without_an_empty_cell():
    """An arm with no tuned value is 'attention.n_heads=1', not 'attention.n_heads=1 (-)'; a tuned one keeps its cell."""
    from mhalab.report.command import comparison_table

    rows = [{"arm": "attention.n_heads=1", "arm_cell": "-", "endpoint": "final val/acc", "arm_value": "0.5",
             "baseline_value": "0.6", "test": "permutation", "verdict": "not separated"},
            {"arm": "attention.n_heads=2", "arm_cell": "optim.lr=0.001", "endpoint": "final val/acc", "arm_value": "0.5",
             "baseline_value": "0.6", "test": "permutation", "verdict": "not separated"}]
    text = comparison_table(rows).markdown()
    assert "attention.n_heads=1 |" in text and "(-)" not in text
    assert "attention.n_heads=2 (optim.lr=0.001)" in text


def test_final_figure_draws_stage_a_runs_apart_from_the_tested_ones(tmp_path, monkeypatch):
    """With declared stages, the filled dots and the mean are the stage-B runs the comparisons test; the stage-A runs
    that chose the value are hollow, outside the mean, and the tick counts both."""
    import numpy as np

    from mhalab import stats as inf
    from mhalab.report import figures

    defaults = _tests("test_report_defaults")
    drawn = {}
    save = figures._save
    monkeypatch.setattr(figures, "_save", lambda fig, path: drawn.setdefault(path.name, fig) and save(fig, path))
    sel = [0, 1]
    runs = [defaults._run(g, s, 1e-3, None, 0.40 + 0.01 * s + (0.2 if s in sel else 0.0), sel)
            for g in (8, 1) for s in range(6)]
    defaults._write(tmp_path, runs)
    report([tmp_path], baseline="attention.n_kv_heads=8")
    ax = drawn["final.png"].axes[0]
    test_acc = {s: 0.40 + 0.01 * s + (0.2 if s in sel else 0.0) - 0.01 * (s % 3) for s in range(6)}  # _run's test/acc
    hollow = [ln for ln in ax.get_lines() if ln.get_markerfacecolor() == "none"]
    chose = sorted([test_acc[0], test_acc[1]] * 2)
    assert sorted(float(y) for ln in hollow for y in ln.get_ydata()) == pytest.approx(chose)
    tested = [test_acc[s] for s in range(2, 6)]
    filled = [ln for ln in ax.get_lines() if ln.get_marker() == "o" and ln.get_markerfacecolor() != "none"]
    dots = np.concatenate([ln.get_ydata() for ln in filled])
    assert sorted(float(y) for y in dots) == pytest.approx(sorted(tested * 2))
    means = [ln for ln in ax.get_lines() if ln.get_marker() == "s"]
    assert [float(ln.get_ydata()[0]) for ln in means] == pytest.approx([inf.mean_ci(tested)[0]] * 2)
    assert all("4 runs (+2 stage A)" in t.get_text() for t in ax.get_xticklabels())
    assert "stage A: chose the value, not tested" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_a_reference_level_far_off_the_runs_is_named_with_its_side_not_drawn():
    """kv_bpb's runs lie at 3.15-3.25 bpb and the unigram level at 4.55: a line there squeezed them into a band."""
    from mhalab.pictures import new_figure
    from mhalab.report.figures import reference_lines

    fig = new_figure(figsize=(4, 3))
    ax = fig.add_subplot()
    ax.plot([0, 1, 2], [3.15, 3.2, 3.25], "o")
    reference_lines(ax, {"unigram_bpb": 4.55, "near_bpb": 3.3}, "val/bpb")
    drawn = [ln for ln in ax.get_lines() if len(ln.get_xdata()) == 2]
    assert [ln.get_label() for ln in drawn] == ["near bpb: 3.3"] and list(drawn[0].get_ydata()) == [3.3, 3.3]
    labels = [ln.get_label() for ln in ax.get_lines()]
    assert "unigram bpb: 4.55 (above the scale)" in labels
    assert ax.get_ylim()[1] < 3.5  # the runs keep the scale


def test_reached_and_curves_draw_the_runs_the_comparisons_test(tmp_path, monkeypatch):
    """With declared stages, the Kaplan-Meier curve and the learning curves are of the stage-B runs (each legend's
    median and run count is the table's), not of the stage-A runs that chose the value."""
    from mhalab.report import figures

    defaults = _tests("test_report_defaults")
    drawn = {}
    save = figures._save
    monkeypatch.setattr(figures, "_save", lambda fig, path: drawn.setdefault(path.name, fig) and save(fig, path))
    sel = [0, 1]
    steps = {0: 100, 1: 200, 2: 700, 3: 800, 4: 900, 5: 1000}  # stage A fast: with them the median would be 750
    runs = [defaults._run(g, s, 1e-3, steps[s], 0.95, sel) for g in (8, 1) for s in range(6)]
    defaults._write(tmp_path, runs)
    report([tmp_path], baseline="attention.n_kv_heads=8")
    reached = [t.get_text() for t in drawn["reached.png"].axes[0].get_legend().get_texts()]
    assert reached and all(t.endswith("median 800") for t in reached), reached  # 700, 800, 900, 1000: the table's
    curves = [t.get_text() for t in drawn["curves.png"].axes[0].get_legend().get_texts() if "median" in t.get_text()]
    assert len(curves) == 2 and all(t.endswith("median of 4 runs") for t in curves), curves


def test_a_legend_drops_only_the_config_group_so_nested_keys_keep_their_meaning():
    from mhalab.report.figures import short

    assert short("attention.n_kv_heads=4") == "n_kv_heads=4" and short("optim.lr=0.001") == "lr=0.001"
    assert short("model.param_match.d_head=64") == "param_match.d_head=64"  # not "d_head=64": another arm's name
    assert short("attention.d_head=8, model.param_match=null") == "d_head=8, param_match=null"
    assert short("seed=0") == "seed=0" and short("-") == "-"
