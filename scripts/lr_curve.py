"""Learning rate as a curve (issue 27): per arm, the fraction of runs reaching the endpoint threshold and the median
steps to it, against the learning rate, from a report's runs.csv (stage A: every rate on the selection seeds).

    python scripts/lr_curve.py logs/<task>/multiruns/<stage A>/report [--out lr_curve.png]

Writes lr_curve.csv (arm, lr, runs, reached, median_steps over the runs that reached, the steps of each of them,
whether the report chose that rate) and lr_curve.png beside it: the fraction reaching the threshold, and every
run's steps to it with the median, per arm; each arm's chosen (frozen) rate is ringed. The median is over the runs
that reached the threshold (their steps are observed); `reached` says how many.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

from mhalab.pictures import log_dodge, new_figure
from mhalab.tables import write_csv


def _number(x: float) -> float | int:
    """A median of step counts as an int where it is one (1400, not 1400.0)."""
    return int(x) if x == int(x) else x


def curve(rows: list[dict]) -> list[dict]:
    """One row per (arm, learning rate): runs, runs reaching the threshold, median steps of those; arms in the order
    runs.csv gives them (the report's: d_head 8, 16, 32, 64, not as text sorts them), rates ascending."""
    cells: dict[tuple[str, float], list[dict]] = {}
    for r in rows:
        lr = [float(o.split("=")[1]) for o in r["cell"].split(", ") if o.startswith("optim.lr=")]
        if not lr:
            sys.exit(f"runs.csv cell {r['cell']!r} has no optim.lr: this is not a learning-rate sweep")
        cells.setdefault((r["arm"], lr[0]), []).append(r)
    out = []
    order = {arm: i for i, arm in enumerate(dict.fromkeys(r["arm"] for r in rows))}
    for (arm, lr), rs in sorted(cells.items(), key=lambda c: (order[c[0][0]], c[0][1])):
        steps = [int(float(r["threshold_step"])) for r in rs if r["reached"] == "True" and r["threshold_step"]]
        out.append({"arm": arm, "lr": lr, "runs": len(rs), "reached": len(steps),
                    "median_steps": _number(statistics.median(steps)) if steps else None,
                    "steps": " ".join(map(str, sorted(steps))), "chosen": any(r.get("chosen_cell") == "True"
                                                                              for r in rs)})
    return out


def plot(points: list[dict], path: Path) -> None:
    fig = new_figure(figsize=(9, 3.6))
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    arms = list(dict.fromkeys(p["arm"] for p in points))
    for i, arm in enumerate(arms):
        ps = [p for p in points if p["arm"] == arm]
        shift = log_dodge(i, len(arms))
        line, = ax1.plot([p["lr"] * shift for p in ps], [p["reached"] / p["runs"] for p in ps], "o-", label=arm)
        colour = line.get_color()
        reached = [p for p in ps if p["median_steps"] is not None]
        ax2.plot([p["lr"] * shift for p in reached], [p["median_steps"] for p in reached], "-", color=colour)
        runs = [(p["lr"] * shift, int(s)) for p in reached for s in p["steps"].split()]
        ax2.plot([x for x, _ in runs], [y for _, y in runs], "o", color=colour, markersize=3, alpha=0.6)
        for p in ps:
            if p["chosen"]:
                ax1.plot(p["lr"] * shift, p["reached"] / p["runs"], "o", color=colour, mfc="none", markersize=11)
                if p["median_steps"] is not None:
                    ax2.plot(p["lr"] * shift, p["median_steps"], "o", color=colour, mfc="none", markersize=11)
    grid = sorted({p["lr"] for p in points})
    for ax, y in ((ax1, "fraction of runs reaching the threshold"),
                  (ax2, "steps to it: each run that did, and the median")):
        ax.set_xscale("log")
        ax.set_xticks(grid, [f"{lr:.3g}" for lr in grid], rotation=45, fontsize=7)
        ax.minorticks_off()
        ax.set_xlabel("learning rate (ringed: each arm's chosen rate)", fontsize=8)
        ax.set_ylabel(y, fontsize=8)
    ax2.set_yscale("log")
    ax1.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("report", type=Path, help="a report folder holding runs.csv")
    args = p.parse_args(argv)
    with open(args.report / "runs.csv", newline="") as f:
        points = curve(list(csv.DictReader(f)))
    write_csv(args.report / "lr_curve.csv", ["arm", "lr", "runs", "reached", "median_steps", "steps", "chosen"],
              points)
    plot(points, args.report / "lr_curve.png")
    print(f"wrote {args.report / 'lr_curve.csv'} and lr_curve.png", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
