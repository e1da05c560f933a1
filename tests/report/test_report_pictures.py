"""The report's pictures say what they draw: the interval is named, every reference line has a label, legends
read without config groups or '(-)'; report.html links each run's interactive attention page."""

import importlib.util
from pathlib import Path

from mhalab.report.command import report
from mhalab.report.figures import INTERVAL

_spec = importlib.util.spec_from_file_location("report_tests", Path(__file__).parent / "test_report.py")
report_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report_tests)


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
