"""The same runs twice (same overrides, same seeds), on one machine or two: how far apart are their outcomes?

    python scripts/repeat_agreement.py FIRST_DIR[,DIR...] REPEAT_DIR[,DIR...] --out AGREEMENT.md

Each run is matched by what it computes (its recorded identity, mhalab.runs.identity: a resumed run matches a run that
was not; runs of one side only are left out) and labelled by its overrides. With an endpoint threshold (MQAR) the
table gives, per run, the step it first reached the threshold (or "-"), its best val metric and its final test
accuracy in each folder, and marks the runs whose outcome (reached or not) differs: on deterministic kernels the two
agree run for run; where they do not, the outcome of a single run rests on numerics, not on the design (the knife
edge of issue 27). Without one (a continuous endpoint such as val/bpb) it gives the final val metric and its test
counterpart on each side and their difference, and the largest difference. The heading names the machines each
side ran on (run_design.machine: a run's GPU, else its CPU), so a repeat on another machine measures that machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_design import machine  # noqa: E402  (one name for what a run ran on)

from mhalab.report.runs import find_runs  # noqa: E402
from mhalab.runs.identity import NOT_IDENTITY, run_identity  # noqa: E402
from mhalab.tables import Table, fmt  # noqa: E402


def runs_by_identity(folders: list[Path]) -> dict[tuple, object]:
    """Each finished run under `folders` by (its overrides that say what it computes, its recorded identity)."""
    found, _ = find_runs(folders)
    return {(tuple(sorted(o for o in s.overrides if o.split(".")[0].split("=")[0] not in NOT_IDENTITY)),
             json.dumps(run_identity(d) or s.overrides, sort_keys=True)): s for d, s in found}


def reached(a: dict, b: dict, keys: list[tuple], metric: str) -> tuple[Table, str]:
    """Threshold endpoint: per run, the step reached, the best val metric and test/acc on each side."""
    t = Table(["run (overrides)", "first: step reached", "repeat: step reached", f"first: best {metric}",
               f"repeat: best {metric}", "first: test/acc", "repeat: test/acc", "outcome"])
    flips = same = 0
    for k in keys:
        x, y = a[k], b[k]
        sx, sy = x.endpoint.get("threshold_step"), y.endpoint.get("threshold_step")
        differs = (sx is None) != (sy is None)
        flips += differs
        same += (sx == sy and x.metrics.get(f"{metric}_best") == y.metrics.get(f"{metric}_best")
                 and x.test_metrics.get("test/acc") == y.test_metrics.get("test/acc"))
        t.add([" ".join(k[0]), sx if sx is not None else "-", sy if sy is not None else "-",
               fmt(x.metrics.get(f"{metric}_best"), 4), fmt(y.metrics.get(f"{metric}_best"), 4),
               fmt(x.test_metrics.get("test/acc"), 4), fmt(y.test_metrics.get("test/acc"), 4),
               "differs" if differs else "same"], bold=[7] if differs else [])
    return t, (f"**{flips} of {len(keys)} runs** reach the threshold in one folder and not in the other; {same} of "
               f"{len(keys)} are identical in every figure below.")


def continuous(a: dict, b: dict, keys: list[tuple], metric: str) -> tuple[Table, str]:
    """Continuous endpoint: per run, the final val metric and its test counterpart on each side, repeat - first."""
    test = "test/" + metric.split("/", 1)[-1]
    t = Table(["run (overrides)", f"first: {metric}", f"repeat: {metric}", "difference", f"first: {test}",
               f"repeat: {test}", "difference"])
    gaps = {metric: [], test: []}
    for k in keys:
        x, y = a[k], b[k]
        row = [" ".join(k[0])]
        for m, side in ((metric, "metrics"), (test, "test_metrics")):
            vx, vy = getattr(x, side).get(m), getattr(y, side).get(m)
            d = None if vx is None or vy is None else vy - vx
            gaps[m] += [abs(d)] if d is not None else []
            row += [f"{vx:.6f}" if vx is not None else "-", f"{vy:.6f}" if vy is not None else "-",
                    f"{d:+.2e}" if d is not None else "-"]
        t.add(row)
    same = sum(a[k].metrics.get(metric) == b[k].metrics.get(metric) and a[k].test_metrics.get(test)
               == b[k].test_metrics.get(test) for k in keys)
    largest = "; ".join(f"{m} {max(g):.2e}" for m, g in gaps.items() if g)
    return t, (f"**The largest difference of {len(keys)} matched runs**: {largest or '-'} (repeat minus first, in "
               f"absolute value); {same} of {len(keys)} are identical in both figures.")


def agreement(first: list[Path], repeat: list[Path]) -> tuple[str, str, int]:
    """The Markdown table, its summary sentence (machines included) and the number of matched runs."""
    a, b = runs_by_identity(first), runs_by_identity(repeat)
    keys = sorted(set(a) & set(b))
    ep = a[keys[0]].endpoint if keys else {}
    metric = ep.get("metric") or "val/acc"
    table, summary = (reached if ep.get("threshold") is not None else continuous)(a, b, keys, metric)
    ran = [", ".join(sorted({machine(s[k].environment) for k in keys})) or "-" for s in (a, b)]
    return table.markdown(), f"First ran on {ran[0]}; repeat on {ran[1]}. {summary}", len(keys)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("first", help="the first runs' folder(s), comma-separated")
    ap.add_argument("repeat", help="the repeat's folder(s), comma-separated")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    table, summary, _ = agreement(*([Path(p) for p in side.split(",") if p] for side in (args.first, args.repeat)))
    text = (f"# The same runs twice: {args.first} and {args.repeat}\n\n`python scripts/repeat_agreement.py "
            f"{args.first} {args.repeat} --out {args.out}`\n\n{summary}\n\n{table}\n")
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
