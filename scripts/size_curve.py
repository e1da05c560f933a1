"""The size curve of a design with model sizes as strata (issue 27, kv_bpb): every tested run's final metric against
d_model, and what each arm costs against the baseline at each size, under each numerics.

    python scripts/size_curve.py 64:B:experiments/kv_bpb/results 64:avx2:experiments/kv_bpb/results-avx2 \\
        128:B:experiments/kv_bpb/results-d128 ... [--out DIR]

Each argument SIZE:NUMERICS:DIR names one report folder `mhalab report` wrote (its runs.csv and report.json). Left:
the final metric of every tested run (`in_verdicts`) against the size, per arm (colour) and numerics (marker).
Right: each arm's difference from the baseline, the report's estimate with its 95% interval (inverted from the
report's test), per numerics, filled where Holm-separated. Writes size_curve.csv (size, numerics, arm, baseline,
estimate, ci95_low, ci95_high, p_holm, verdict) and size_curve.png into --out (default: the current folder).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from mhalab.pictures import log_dodge, new_figure
from mhalab.tables import write_csv

COLUMNS = ["size", "numerics", "arm", "baseline", "endpoint", "estimate", "ci95_low", "ci95_high", "p_holm",
           "verdict"]
MARKERS = "osD^v<>"


def parse(item: str) -> tuple[int, str, Path]:
    size, numerics, folder = (item.split(":", 2) + ["", ""])[:3]
    if not size.isdigit() or not numerics or not folder:
        sys.exit(f"{item!r}: give SIZE:NUMERICS:DIR, e.g. 128:B:experiments/kv_bpb/results-d128")
    for name in ("runs.csv", "report.json"):
        if not (Path(folder) / name).is_file():
            sys.exit(f"{Path(folder) / name} is missing: give a folder `mhalab report` wrote")
    return int(size), numerics, Path(folder)


def read(items: list[str]) -> tuple[list[dict], list[dict], str]:
    """(every tested run: size, numerics, arm, seed, value; every final-metric comparison; the metric's name)."""
    points, comparisons, metrics = [], [], set()
    for size, numerics, folder in map(parse, items):
        report = json.loads((folder / "report.json").read_text())
        finals = [c for c in report["comparisons"] if c["endpoint"].startswith("final ")]
        if not finals:
            sys.exit(f"{folder}/report.json has no comparison of a final metric")
        metric = finals[0]["endpoint"].removeprefix("final ")
        metrics.add(metric)
        for c in finals:
            comparisons.append({"size": size, "numerics": numerics, **{k: c[k] for k in COLUMNS[2:]}})
        with open(folder / "runs.csv", newline="") as f:
            for r in csv.DictReader(f):
                if r["in_verdicts"] == "True" and r.get(metric):
                    points.append({"size": size, "numerics": numerics, "arm": r["arm"], "seed": int(r["seed"]),
                                   metric: float(r[metric])})
    if len(metrics) != 1:
        sys.exit(f"the reports compare different metrics ({', '.join(sorted(metrics))}): give one design's reports")
    return points, comparisons, metrics.pop()


def plot(points: list[dict], comparisons: list[dict], metric: str, path: Path) -> None:
    fig = new_figure(figsize=(11, 5.6))
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    arms = list(dict.fromkeys(p["arm"] for p in points))
    numerics = list(dict.fromkeys(p["numerics"] for p in points))
    colour = {arm: f"C{i % 10}" for i, arm in enumerate(arms)}
    sizes = sorted({p["size"] for p in points})
    slots = len(arms) * len(numerics)
    for i, arm in enumerate(arms):
        for j, num in enumerate(numerics):
            shift = log_dodge(i * len(numerics) + j, slots)
            pts = [p for p in points if (p["arm"], p["numerics"]) == (arm, num)]
            ax1.scatter([p["size"] * shift for p in pts], [p[metric] for p in pts], s=12, alpha=0.6,
                        color=colour[arm], marker=MARKERS[j % len(MARKERS)],
                        label=f"{arm}, {num}" if pts else None)
            cs = sorted((c for c in comparisons if (c["arm"], c["numerics"]) == (arm, num)), key=lambda c: c["size"])
            if cs:
                ax2.plot([c["size"] * shift for c in cs], [c["estimate"] for c in cs], color=colour[arm], lw=0.8)
            for k, c in enumerate(cs):
                separated = c["verdict"].startswith("separated")
                ax2.errorbar([c["size"] * shift], [c["estimate"]],
                             yerr=[[c["estimate"] - c["ci95_low"]], [c["ci95_high"] - c["estimate"]]],
                             fmt=MARKERS[j % len(MARKERS)], color=colour[arm], capsize=3,
                             mfc=colour[arm] if separated else "white",
                             label=f"{arm} - baseline, {num}" if k == 0 else None)
    baseline = comparisons[0]["baseline"]
    ax2.axhline(0, color="k", lw=0.8, ls="--")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.minorticks_off()
        ax.set_xlabel("d_model")
    ax1.set_ylabel(f"final {metric} (every tested run)")
    ax2.set_ylabel(f"difference from {baseline} [95% CI]\n(filled: separated after Holm)")
    for ax in (ax1, ax2):  # below the axes: no legend hides a run
        ax.legend(fontsize=6, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.13))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+", help="SIZE:NUMERICS:DIR, one per report folder")
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args(argv)
    points, comparisons, metric = read(args.reports)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "size_curve.csv", COLUMNS, comparisons)
    plot(points, comparisons, metric, args.out / "size_curve.png")
    print(f"wrote {args.out}/size_curve.csv and size_curve.png ({len(points)} runs, {len(comparisons)} comparisons)")


if __name__ == "__main__":
    main(sys.argv[1:])
