"""scripts/size_curve.py: the final metric of every tested run against the model size, and each arm's difference
from the baseline at each size and numerics, read from `mhalab report` folders."""

import csv
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import size_curve  # noqa: E402

MHA, MQA = "attention.n_kv_heads=4", "attention.n_kv_heads=1"


def report(folder: Path, values: dict[str, list[float]], estimate: float, verdict: str) -> Path:
    """A report folder: runs.csv with a stage-A run (not tested) and the tested runs, report.json with one final
    comparison and one that is not final (which must not count)."""
    folder.mkdir(parents=True)
    with open(folder / "runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["arm", "seed", "in_verdicts", "test/bpb"])
        w.writeheader()
        for arm, vs in values.items():
            w.writerow({"arm": arm, "seed": 0, "in_verdicts": False, "test/bpb": 9.0})
            for i, v in enumerate(vs):
                w.writerow({"arm": arm, "seed": 10 + i, "in_verdicts": True, "test/bpb": v})
    final = {"arm": MQA, "baseline": MHA, "endpoint": "final test/bpb", "estimate": estimate,
             "ci95_low": estimate - 0.1, "ci95_high": estimate + 0.1, "p_holm": 0.5, "verdict": verdict}
    other = {**final, "endpoint": "steps to the threshold (Kaplan-Meier median)"}
    (folder / "report.json").write_text(json.dumps({"comparisons": [final, other]}))
    return folder


def test_every_tested_run_and_each_final_comparison(tmp_path, capsys):
    a = report(tmp_path / "a", {MHA: [3.2, 3.1], MQA: [3.3, 3.2]}, 0.1, "not separated")
    b = report(tmp_path / "b", {MHA: [2.9, 2.8], MQA: [2.6, 2.7]}, -0.2, "separated")
    points, comparisons, metric = size_curve.read([f"64:B:{a}", f"128:avx2:{b}"])
    assert metric == "test/bpb" and len(points) == 8 and 9.0 not in {p["test/bpb"] for p in points}
    assert [(c["size"], c["numerics"], c["estimate"]) for c in comparisons] == [(64, "B", 0.1), (128, "avx2", -0.2)]
    size_curve.main([f"64:B:{a}", f"128:avx2:{b}", "--out", str(tmp_path / "out")])
    assert (tmp_path / "out" / "size_curve.png").stat().st_size > 0
    with open(tmp_path / "out" / "size_curve.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["size"], r["verdict"]) for r in rows] == [("64", "not separated"), ("128", "separated")]
    assert "8 runs, 2 comparisons" in capsys.readouterr().out


def test_a_folder_without_a_report_or_its_size_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="SIZE:NUMERICS:DIR"):
        size_curve.main([str(tmp_path)])
    with pytest.raises(SystemExit, match="report.json is missing"):
        (tmp_path / "r").mkdir()
        (tmp_path / "r" / "runs.csv").write_text("arm\n")
        size_curve.main([f"64:B:{tmp_path / 'r'}"])
