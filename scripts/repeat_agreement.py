"""Two runs of the same sweep (same overrides, same seeds): does each run reach the endpoint's threshold in both?

    python scripts/repeat_agreement.py FIRST_DIR REPEAT_DIR --out AGREEMENT.md

Each run is matched by its overrides; the table gives, per run, the step it first reached the threshold (or "-"),
its best val metric and its final test accuracy in each folder, and marks the runs whose outcome (reached or not)
differs. On deterministic kernels the two folders agree run for run; where they do not, the outcome of a single
run rests on numerics, not on the design (the knife edge of issue 27).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mhalab.report.runs import find_runs
from mhalab.tables import Table, fmt


def runs_by_overrides(folder: Path) -> dict[tuple, object]:
    found, _ = find_runs([folder])
    return {tuple(sorted(s.overrides)): s for _, s in found}


def agreement(first: Path, repeat: Path) -> tuple[str, int, int, int]:
    """The Markdown table, the number of matched runs, the number whose outcome differs and the number identical in
    every figure of the table."""
    a, b = runs_by_overrides(first), runs_by_overrides(repeat)
    keys = sorted(set(a) & set(b))
    metric = a[keys[0]].endpoint["metric"] if keys else "val/acc"
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
        t.add([" ".join(k), sx if sx is not None else "-", sy if sy is not None else "-",
               fmt(x.metrics.get(f"{metric}_best"), 4), fmt(y.metrics.get(f"{metric}_best"), 4),
               fmt(x.test_metrics.get("test/acc"), 4), fmt(y.test_metrics.get("test/acc"), 4),
               "differs" if differs else "same"], bold=[7] if differs else [])
    return t.markdown(), len(keys), flips, same


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("first", type=Path)
    ap.add_argument("repeat", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    table, n, flips, same = agreement(args.first, args.repeat)
    text = (f"# The same runs twice: {args.first} and {args.repeat}\n\n`python scripts/repeat_agreement.py "
            f"{args.first} {args.repeat} --out {args.out}`\n\n**{flips} of {n} runs** reach the threshold in one "
            f"folder and not in the other; {same} of {n} are identical in every figure below.\n\n{table}\n")
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
