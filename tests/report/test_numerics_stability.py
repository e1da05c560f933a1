"""`mhalab report --numerics`: a design's verdicts read side by side under each numerics, stable or flipping, with
the environment its tested runs recorded (issue 27: a verdict that flips on another CPU is not a verdict)."""

import csv
import importlib.util
import json
import os
from pathlib import Path

import pytest

from mhalab.errors import ConfigError
from mhalab.report import numerics
from mhalab.report.command import report, report_command
from mhalab.report.options import ReportOptions

_spec = importlib.util.spec_from_file_location("report_defaults", Path(__file__).parent / "test_report_defaults.py")
defaults = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(defaults)
SEL = [0, 1]


def design(root: Path, name: str, gap: float, capability: str = "AVX512") -> Path:
    """One numerics' report of a 2-arm design: MHA and MQA, seeds 0-1 choose (stage A), seeds 2-9 are tested; MQA's
    test/acc lies `gap` above MHA's on every tested seed."""
    runs = [defaults._run(g, s, 1e-3, None, 0.5 + 0.001 * s + (gap if g == 1 else 0.0), SEL)
            for g in (8, 1) for s in range(10)]
    for r in runs:
        r.environment["cpu_capability"] = capability
    defaults._write(root / name / "runs", runs)
    report([root / name / "runs"], out=root / f"report-{name}", baseline="attention.n_kv_heads=8", plots=False)
    return root / f"report-{name}" / "report.json"


def test_a_verdict_that_holds_under_every_numerics_is_stable_and_one_that_does_not_flips(tmp_path):
    files = [design(tmp_path, "B", 0.05), design(tmp_path, "avx2", 0.04, "AVX2"), design(tmp_path, "threads2", 0.0)]
    finals = [next(c["verdict"] for c in json.loads(f.read_text())["comparisons"] if c["endpoint"].startswith("final"))
              for f in files]
    assert finals[:2] == ["separated"] * 2 and finals[2].startswith("not separated")  # the premise
    both = numerics.stability(files[:2])
    by = {r["endpoint"].split(" ")[0]: r for r in both["rows"]}
    assert by["rate"]["stable"] is True and by["rate"]["verdict"] == "not separated"  # no run reached 0.9
    assert by["steps"]["stable"] is None and by["steps"]["verdict"] == "no test"  # nothing to compare anywhere
    final = by["final"]
    assert final["verdict"] == "separated, arm higher" and final["B/verdict"] == final["avx2/verdict"]
    assert both["environment"]["avx2"]["cpu_capability"] == "AVX2"
    assert both["environment"]["B"]["cpu_capability"] == "AVX512"
    three = numerics.stability(files)
    final = next(r for r in three["rows"] if r["endpoint"].startswith("final"))
    assert final["stable"] is False and final["verdict"] == "flips" and final["threads2/verdict"] == "not separated"
    md = numerics.markdown(three)
    assert "flips: no verdict" in md and "| threads2 |" in md


def test_the_command_writes_stability_beside_the_reports_and_refuses_reports_of_different_designs(tmp_path, capsys):
    files = [design(tmp_path, "B", 0.05), design(tmp_path, "avx2", 0.05, "AVX2")]
    assert report_command(ReportOptions(dirs=files, numerics=True)) == 0
    assert "stable: separated, arm higher" in capsys.readouterr().out
    with (tmp_path / "stability.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["endpoint"].split(" ")[0]: r["stable"] for r in rows} == {"rate": "True", "steps": "", "final": "True"}
    assert {"B/p_holm", "avx2/p_holm"} <= set(rows[0])
    assert json.loads((tmp_path / "stability.json").read_text())["numerics"] == ["B", "avx2"]
    other = tmp_path / "other"
    other.mkdir()
    data = json.loads(files[1].read_text())
    data["comparisons"] = data["comparisons"][:1]
    (other / "report.json").write_text(json.dumps(data))
    (other / "runs.csv").write_text((files[1].parent / "runs.csv").read_text())
    with pytest.raises(ConfigError, match="hold different comparisons"):
        numerics.stability([files[0], other / "report.json"])
    with pytest.raises(ConfigError, match="at least two"):
        numerics.stability(files[:1])
    named = numerics.stability([f"default:{files[0]}", files[1]])  # a name given, or the folder's
    assert named["numerics"] == ["default", "avx2"] and named["sources"] == [str(files[0]), str(files[1])]


def test_the_verdicts_table_has_one_row_per_comparison_with_each_numerics_and_refuses_mixed_files(tmp_path, capsys):
    files = [design(tmp_path, "B", 0.05), design(tmp_path, "avx2", 0.04, "AVX2"), design(tmp_path, "threads2", 0.0)]
    numerics.write(numerics.stability(files[:2]), tmp_path / "two")
    numerics.write(numerics.stability(files), tmp_path / "three")
    tables = [tmp_path / "two" / "stability.json", tmp_path / "three" / "stability.json"]
    assert report_command(ReportOptions(dirs=tables, table=True)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| design | arm vs baseline | endpoint | numerics |") and len(lines) == 2 + 3 + 3
    final = [line for line in lines if "final test/acc" in line]
    assert "| B / avx2 | 0.050 / 0.040 |" in final[0] and final[0].endswith("| **stable: separated, arm higher** |")
    assert "| B / avx2 / threads2 | 0.050 / 0.040 / 0.000 |" in final[1] and final[1].endswith("| flips: no verdict |")
    seen_from_here = os.path.relpath(tmp_path / "three", Path.cwd())  # the CLI's links: from the working folder
    assert f"[{seen_from_here}]({seen_from_here}/stability.md)" in final[1]
    beside = numerics.verdicts_table(tables, base=tmp_path)  # from the folder the table is read in (embed_reports)
    assert "| [three](three/stability.md) |" in beside and "| [two](two/stability.md) |" in beside
    with pytest.raises(ConfigError, match="not both"):
        report_command(ReportOptions(dirs=[tables[0], files[0]], table=True))


def test_a_link_at_an_output_name_is_refused_not_followed(tmp_path):
    files = [design(tmp_path, "B", 0.05), design(tmp_path, "avx2", 0.05)]
    target = tmp_path / "elsewhere.md"
    target.write_text("keep")
    out = tmp_path / "out"
    out.mkdir()
    (out / "stability.md").symlink_to(target)
    with pytest.raises(ConfigError, match="symbolic link"):
        numerics.write(numerics.stability(files), out)
    assert target.read_text() == "keep"


def test_a_log_rank_separation_has_a_side_from_its_direction():
    """Steps to the threshold carry no estimate: the side comes from the log-rank's direction (+ = the arm takes
    more steps), so two numerics separating in opposite directions flip; a report of before `direction` says only
    "separated" (it crashed the stability check on the first GPU reports)."""
    steps = {"endpoint": "steps to the threshold (Kaplan-Meier median)", "estimate": None, "p": 0.001,
             "degenerate": None, "verdict": "separated"}
    assert numerics.verdict_class({**steps, "direction": 3.2}) == "separated, arm higher"
    assert numerics.verdict_class({**steps, "direction": -3.2}) == "separated, arm lower"
    assert numerics.verdict_class(steps) == "separated"
