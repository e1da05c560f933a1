"""scripts/conversion_curve.py: a conversion design's uptraining curve (metric against the uptraining fraction per
target and init) from the conversion.json files `mhalab convert` writes."""

import csv
import json
import sys
from pathlib import Path

import pytest

from mhalab.analysis.convert import summarise

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import conversion_curve  # noqa: E402


def conversion(folder: Path, g: int, fraction: float, gain: float, margin: float | None = 0.03) -> None:
    """What `mhalab convert --margin` writes (its own summarise) for 4 sources: mean-pool `gain` below the source
    (bits per byte, lower is better) after uptraining."""
    rows = []
    for s in range(4):
        for arm, init, stage, bpb in (("source (MHA)", "-", "trained", 3.0 + 0.01 * s),
                                      ("source (MHA) + extra steps", "-", "same total steps", 2.99 + 0.01 * s),
                                      (f"converted GQA-{g}", "mean", "before uptraining", 3.4),
                                      (f"converted GQA-{g}", "mean", "after uptraining", 3.0 - gain + 0.01 * s),
                                      (f"GQA-{g} from scratch", "random", "uptraining steps only", 5.0)):
            rows.append({"arm": arm, "init": init, "stage": stage, "seed": s, "bpb": bpb, "total_steps": 1,
                         "params": 1})
    table, comps = summarise(rows, "bpb", margin)
    out = folder / f"g{g}-f{fraction}"
    out.mkdir(parents=True)
    (out / "conversion.json").write_text(json.dumps({"n_kv_heads": g, "uptrain_fraction": fraction, "key": "bpb",
                                                     "margin": margin, "table": table, "comparisons": comps}))


def test_the_curve_has_one_point_per_target_budget_and_arm(tmp_path):
    for g in (1, 2):
        for f, gain in ((0.01, 0.0), (0.1, 0.02)):
            conversion(tmp_path, g, f, gain)
    conversion_curve.main([str(tmp_path)])
    with open(tmp_path / "conversion_curve.csv") as fh:
        got = list(csv.DictReader(fh))
    mean_pool = [r for r in got if r["init"] == "mean" and r["stage"] == "after uptraining" and r["n_kv_heads"] == "1"]
    assert [(r["fraction"], round(float(r["mean"]), 4)) for r in mean_pool] == [("0.01", 3.015), ("0.1", 2.995)]
    assert len(got) == 2 * 2 * 5  # targets x budgets x arms
    assert (tmp_path / "conversion_curve.png").stat().st_size > 0


def test_conversions_with_different_margins_are_refused(tmp_path):
    conversion(tmp_path, 1, 0.01, 0.0, margin=0.03)
    conversion(tmp_path, 1, 0.1, 0.0, margin=0.05)
    with pytest.raises(SystemExit, match="margins"):
        conversion_curve.main([str(tmp_path)])
