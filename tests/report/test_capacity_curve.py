"""scripts/capacity_curve.py: per arm, the final accuracy and the share reaching the threshold against the MQAR load,
and the largest load each arm solves (the design's rule: 7 of its 8 tested runs reach the threshold)."""

import csv
import sys
from fractions import Fraction
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import capacity_curve  # noqa: E402


def report(folder: Path, reached: dict[str, int], env: dict | None = None) -> str:
    """A report folder's runs.csv: 8 tested runs an arm, `reached[arm]` of them at the threshold; one stage-A run
    (not tested) that must not count; every run with the env_* columns `env` where given."""
    folder.mkdir(parents=True)
    env = env or {}
    with open(folder / "runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["arm", "seed", "stage", "in_verdicts", "reached", "test/acc", *env])
        w.writeheader()
        for arm, k in reached.items():
            w.writerow({"arm": arm, "seed": 0, "stage": "A", "in_verdicts": False, "reached": True, "test/acc": 1.0,
                        **env})
            for s in range(8):
                w.writerow({"arm": arm, "seed": 10 + s, "stage": "B", "in_verdicts": True, "reached": s < k,
                            "test/acc": 0.995 if s < k else 0.3, **env})
    return str(folder)


def test_the_largest_load_solved_follows_the_declared_rule(tmp_path):
    mha, mqa = "attention.n_kv_heads=4", "attention.n_kv_heads=1"
    loads = [f"4:{report(tmp_path / 'l4', {mha: 8, mqa: 8})}", f"8:{report(tmp_path / 'l8', {mha: 8, mqa: 7})}",
             f"16:{report(tmp_path / 'l16', {mha: 7, mqa: 6})}", f"32:{report(tmp_path / 'l32', {mha: 2, mqa: 0})}"]
    points = capacity_curve.read(loads)
    assert len(points) == 4 * 2 * 8  # stage-A rows are not points
    rows, largest = capacity_curve.curve(points, Fraction(7, 8))
    assert largest == {mqa: 8, mha: 16}
    row = next(r for r in rows if r["arm"] == mqa and r["load"] == 16)
    assert (row["runs"], row["reached"], row["solved"]) == (8, 6, False)
    assert row["mean_test_acc"] == pytest.approx((6 * 0.995 + 2 * 0.3) / 8)
    capacity_curve.main([*loads, "--out", str(tmp_path / "out")])
    assert (tmp_path / "out" / "capacity_curve.png").stat().st_size > 0
    with open(tmp_path / "out" / "capacity_curve.csv") as f:
        assert len(list(csv.DictReader(f))) == 8


def test_a_load_without_its_folder_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="LOAD:DIR"):
        capacity_curve.main([str(tmp_path)])


def test_the_largest_load_says_what_it_hides(tmp_path, capsys):
    """The declared rule's one number: a load below it that the arm fails (not monotone, so not capacity) and
    loads where the arm has no runs are said beside it, in the printout and the figure's legend."""
    mha, gqa, mqa = "attention.n_kv_heads=4", "attention.n_kv_heads=2", "attention.n_kv_heads=1"
    loads = [f"8:{report(tmp_path / 'l8', {mha: 8, gqa: 8})}",
             f"16:{report(tmp_path / 'l16', {mha: 8, gqa: 8, mqa: 5})}",
             f"32:{report(tmp_path / 'l32', {mha: 8, gqa: 2, mqa: 7})}"]
    rows, largest = capacity_curve.curve(capacity_curve.read(loads), Fraction(7, 8))
    assert largest == {mha: 32, gqa: 16, mqa: 32}
    assert capacity_curve.solved_text(mha, rows, 32) == "32"
    assert capacity_curve.solved_text(gqa, rows, 16) == "16"
    assert (capacity_curve.solved_text(mqa, rows, 32)
            == "32 (not solved at 16 below it: not monotone; no tested runs at 8)")
    capacity_curve.main([*loads, "--out", str(tmp_path / "out")])
    assert "attention.n_kv_heads=1: largest load solved 32 (not solved at 16 below it" in capsys.readouterr().out


def test_the_figure_and_table_name_the_machine_of_each_load(tmp_path, capsys):
    """A figure whose loads ran on different machines says which ran where (a GPU by its name, a CPU by its
    processor), with the precision; a report without env columns says the machine was not recorded."""
    mha = "attention.n_kv_heads=4"
    xeon = {"env_device": "cpu", "env_processor": "Intel(R) Xeon(R) Processor (family 6 model 167, avx512)",
            "env_precision": "32-true"}
    h100 = {"env_device": "NVIDIA H100 80GB HBM3", "env_processor": "Intel(R) Xeon(R) Processor",
            "env_precision": "32-true"}
    loads = [f"4:{report(tmp_path / 'l4', {mha: 8}, xeon)}", f"8:{report(tmp_path / 'l8', {mha: 8}, xeon)}",
             f"16:{report(tmp_path / 'l16', {mha: 8}, h100)}", f"32:{report(tmp_path / 'l32', {mha: 8})}"]
    capacity_curve.main([*loads, "--out", str(tmp_path / "out")])
    assert ("ran on loads 4, 8: Intel(R) Xeon(R) Processor (family 6 model 167, avx512), 32-true; load 16: NVIDIA "
            "H100 80GB HBM3, 32-true; load 32: machine not recorded, precision not recorded") in capsys.readouterr().out
    with open(tmp_path / "out" / "capacity_curve.csv") as f:
        assert [r["ran_on"] for r in csv.DictReader(f)][1:3] == ["Intel(R) Xeon(R) Processor (family 6 model 167, "
                                                                 "avx512), 32-true", "NVIDIA H100 80GB HBM3, 32-true"]


def test_a_cpu_load_names_its_kernels_and_threads(tmp_path, capsys):
    """A CPU's second numerics (ATEN_CPU_CAPABILITY=avx2, or 2 threads) runs on the same processor in the same
    precision: the figure tells the loads apart by the kernels and threads each run recorded."""
    mha = "attention.n_kv_heads=4"
    epyc = {"env_device": "cpu", "env_processor": "AMD EPYC (family 25 model 17, avx512)", "env_precision": "32-true"}
    loads = [f"4:{report(tmp_path / 'l4', {mha: 8}, {**epyc, 'env_cpu_capability': 'AVX2', 'env_torch_threads': 1})}",
             f"8:{report(tmp_path / 'l8', {mha: 8}, {**epyc, 'env_cpu_capability': 'AVX512', 'env_torch_threads': 2})}"]
    capacity_curve.main([*loads, "--out", str(tmp_path / "out")])
    assert ("ran on load 4: AMD EPYC (family 25 model 17, avx512), 32-true, AVX2 kernels; load 8: AMD EPYC (family 25 "
            "model 17, avx512), 32-true, AVX512 kernels, 2 threads") in capsys.readouterr().out
