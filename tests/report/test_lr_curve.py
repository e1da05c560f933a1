"""scripts/lr_curve.py: escape rate and median steps against the learning rate, per arm, from runs.csv."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import lr_curve  # noqa: E402


def row(arm, lr, reached, step):
    return {"arm": arm, "cell": f"optim.lr={lr}", "reached": str(reached), "threshold_step": "" if step is None
            else str(step), "chosen_cell": str(arm.endswith("4") and lr == 0.003)}


def test_curve_counts_runs_reaching_and_takes_the_median_of_their_steps(tmp_path):
    rows = [row("attention.n_kv_heads=4", 0.001, False, None), row("attention.n_kv_heads=4", 0.001, True, 1200),
            row("attention.n_kv_heads=4", 0.003, True, 400), row("attention.n_kv_heads=4", 0.003, True, 800),
            row("attention.n_kv_heads=4", 0.003, True, 600), row("attention.n_kv_heads=1", 0.003, False, None)]
    points = lr_curve.curve(rows)
    assert points == [  # arms in the order of the rows (the report's), rates ascending
        {"arm": "attention.n_kv_heads=4", "lr": 0.001, "runs": 2, "reached": 1, "median_steps": 1200,
         "steps": "1200", "chosen": False},
        {"arm": "attention.n_kv_heads=4", "lr": 0.003, "runs": 3, "reached": 3, "median_steps": 600,
         "steps": "400 600 800", "chosen": True},
        {"arm": "attention.n_kv_heads=1", "lr": 0.003, "runs": 1, "reached": 0, "median_steps": None, "steps": "",
         "chosen": False}]
    lr_curve.plot(points, tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 0
