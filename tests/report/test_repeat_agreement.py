"""scripts/repeat_agreement.py: the same runs twice, matched by what they compute, on one machine or two; a
threshold endpoint compares outcomes, a continuous one the difference of each run's final metrics."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import repeat_agreement  # noqa: E402
from mhalab.runs.identity import write_identity  # noqa: E402
from mhalab.runs.summary import RunSummary, write_summary  # noqa: E402

ZEN3, XEON = "AMD EPYC (family 25 model 1, avx2)", "Intel Xeon (family 6 model 167, avx512)"
BPB = {"metric": "val/bpb", "threshold": None}


def run(job: Path, seed: int, processor: str, val: float, test: float, endpoint: dict, resumed: bool = False):
    """A finished job: its recorded identity (the seed and the rate), a summary with the given metrics."""
    job.mkdir(parents=True)
    write_identity(job, {"seed": seed, "optim": {"lr": 1e-3}, "resume": str(job) if resumed else None})
    write_summary(job, RunSummary(
        status="ok", overrides=[f"seed={seed}", "optim.lr=0.001"] + ([f"resume={job}"] if resumed else []),
        metrics={"val/bpb": val, "val/acc_best": val}, test_metrics={"test/bpb": test, "test/acc": test},
        endpoint=endpoint, environment={"processor": processor, "device": "cpu"}))


def test_a_continuous_endpoint_gives_each_runs_difference_and_matches_resumed_runs(tmp_path):
    for seed, (val, test) in enumerate([(2.5, 2.4), (2.6, 2.55)]):
        run(tmp_path / "zen3" / str(seed), seed, ZEN3, val, test, BPB, resumed=seed == 1)
    run(tmp_path / "xeon" / "0", 0, XEON, 2.5, 2.4 + 3e-5, BPB)
    run(tmp_path / "xeon" / "1", 1, XEON, 2.6 - 2e-5, 2.55, BPB)
    run(tmp_path / "xeon" / "2", 2, XEON, 2.0, 2.0, BPB)  # one side only: left out
    table, summary, n = repeat_agreement.agreement([tmp_path / "zen3"], [tmp_path / "xeon"])
    assert n == 2
    assert summary == (f"First ran on {ZEN3}; repeat on {XEON}. **The largest difference of 2 matched runs**: "
                       "val/bpb 2.00e-05; test/bpb 3.00e-05 (repeat minus first, in absolute value); 0 of 2 are "
                       "identical in both figures.")
    rows = table.splitlines()[2:]
    assert rows == ["| optim.lr=0.001 seed=0 | 2.500000 | 2.500000 | +0.00e+00 | 2.400000 | 2.400030 | +3.00e-05 |",
                    "| optim.lr=0.001 seed=1 | 2.600000 | 2.599980 | -2.00e-05 | 2.550000 | 2.550000 | +0.00e+00 |"]


def test_a_threshold_endpoint_marks_the_runs_whose_outcome_differs(tmp_path):
    mqar = {"metric": "val/acc", "threshold": 0.99}
    run(tmp_path / "a" / "0", 0, XEON, 0.995, 0.99, {**mqar, "threshold_step": 1200})
    run(tmp_path / "b" / "0", 0, XEON, 0.25, 0.25, {**mqar, "threshold_step": None})
    table, summary, n = repeat_agreement.agreement([tmp_path / "a"], [tmp_path / "b"])
    assert n == 1 and summary.endswith("**1 of 1 runs** reach the threshold in one folder and not in the other; "
                                       "0 of 1 are identical in every figure below.")
    assert table.splitlines()[2] == "| optim.lr=0.001 seed=0 | 1200 | - | 0.995 | 0.25 | 0.99 | 0.25 | **differs** |"
