"""The capacity figure of a load design (issue 27, kv_capacity; Zoology's figure shape): per arm, the final test
accuracy of every tested run against the MQAR load (key-value pairs), the share of runs reaching the threshold, and
the largest load each arm solves.

    python scripts/capacity_curve.py 4:DIR 8:DIR 16:DIR 32:DIR [--solved 7/8] [--out DIR]

Each DIR is one load's report folder (`mhalab report` of stage A and that stage B: its runs.csv; the rows tested,
`in_verdicts`, are the points). An arm solves a load when at least the `--solved` share of its tested runs reached
the threshold (the design's rule: 7 of 8). Writes capacity_curve.csv (arm, load, runs, reached, mean final
test/acc, solved, the machine and precision its runs ran with), capacity_points.csv (every run) and
capacity_curve.png, which names the machines too, into --out (default: the current folder).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from fractions import Fraction
from pathlib import Path

from mhalab.pictures import log_dodge, new_figure
from mhalab.runs.summary import machine
from mhalab.tables import write_csv

METRIC = "test/acc"
COLUMNS = ["arm", "load", "runs", "reached", "mean_test_acc", "solved", "ran_on"]


def numerics(env: dict) -> str:
    """A run's machine and numerics from its env_* columns: the GPU or CPU, the precision and, on a CPU, the ATen
    kernels and the torch threads (what a CPU's second numerics changes)."""
    where = machine(env) if env.get("device") or env.get("processor") else "machine not recorded"
    parts = [where, env.get("precision") or "precision not recorded"]
    if env.get("device") == "cpu":
        parts += [f"{env['cpu_capability']} kernels"] if env.get("cpu_capability") else []
        parts += [f"{env['torch_threads']} threads"] if env.get("torch_threads") not in (None, "", "1") else []
    return ", ".join(parts)


def read(loads: list[str]) -> list[dict]:
    """Every tested run of every load: {arm, load, seed, reached, test/acc, ran_on (its machine and numerics)}."""
    out = []
    for item in loads:
        load, sep, folder = item.partition(":")
        if not sep or not load.isdigit():
            sys.exit(f"{item!r}: give LOAD:DIR, e.g. 8:logs/kv_capacity/design/stratum1/report-B")
        path = Path(folder) / "runs.csv"
        if not path.is_file():
            sys.exit(f"{path} is missing: give a folder `mhalab report` wrote")
        with open(path) as f:
            for r in csv.DictReader(f):
                if r["in_verdicts"] == "True":
                    env = {k.removeprefix("env_"): v for k, v in r.items() if k.startswith("env_")}
                    out.append({"arm": r["arm"], "load": int(load), "seed": int(r["seed"]),
                                "reached": r["reached"] == "True", METRIC: float(r[METRIC]), "ran_on": numerics(env)})
    if not out:
        sys.exit("no tested runs (in_verdicts) in these reports")
    return out


def curve(points: list[dict], solved: Fraction) -> tuple[list[dict], dict[str, int | None]]:
    """(one row per arm and load; per arm the largest load solved, None when it solves none)."""
    rows = []
    for arm, load in sorted({(p["arm"], p["load"]) for p in points}):
        ps = [p for p in points if p["arm"] == arm and p["load"] == load]
        reached = sum(p["reached"] for p in ps)
        rows.append({"arm": arm, "load": load, "runs": len(ps), "reached": reached,
                     "mean_test_acc": statistics.fmean(p[METRIC] for p in ps),
                     "solved": Fraction(reached, len(ps)) >= solved,
                     "ran_on": "; ".join(sorted({p["ran_on"] for p in ps}))})
    largest = {arm: max((r["load"] for r in rows if r["arm"] == arm and r["solved"]), default=None)
               for arm in sorted({r["arm"] for r in rows})}
    return rows, largest


def caveat(arm: str, rows: list[dict], largest: int | None) -> str:
    """What the declared rule's one number hides: loads below the largest solved that the arm did not solve (the
    curve is not monotone: failures there are not capacity), and loads other arms ran that this arm has no runs
    at. Empty when there is nothing to say."""
    loads = sorted({r["load"] for r in rows})
    mine = {r["load"]: r["solved"] for r in rows if r["arm"] == arm}
    notes = []
    below = [str(x) for x in loads if largest is not None and x < largest and mine.get(x) is False]
    if below:
        notes.append(f"not solved at {', '.join(below)} below it: not monotone")
    missing = [str(x) for x in loads if x not in mine]
    if missing:
        notes.append(f"no tested runs at {', '.join(missing)}")
    return "; ".join(notes)


def solved_text(arm: str, rows: list[dict], largest: int | None) -> str:
    """'32 (not solved at 16 below it: not monotone)', 'none', ..."""
    note = caveat(arm, rows, largest)
    return f"{largest if largest is not None else 'none'}" + (f" ({note})" if note else "")


def ran_on(points: list[dict]) -> str:
    """'loads 4, 8: <machine, precision>; loads 16, 32: <...>': the hardware of every point, by load."""
    loads = {m: sorted({p["load"] for p in points if p["ran_on"] == m}) for m in sorted({p["ran_on"] for p in points})}
    return "; ".join(f"load{'s' * (len(x) > 1)} {', '.join(map(str, x))}: {m}"
                     for m, x in sorted(loads.items(), key=lambda kv: kv[1]))


def plot(points: list[dict], rows: list[dict], largest: dict, path: Path) -> None:
    fig = new_figure(figsize=(10, 4.8))
    fig.suptitle(f"ran on {ran_on(points)}", fontsize=8)
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    arms = sorted({r["arm"] for r in rows})
    for i, arm in enumerate(arms):
        mine = [r for r in rows if r["arm"] == arm]
        loads = [r["load"] for r in mine]
        shift = log_dodge(i, len(arms), 0.04)
        pts = [p for p in points if p["arm"] == arm]
        line = ax1.plot([x * shift for x in loads], [r["mean_test_acc"] for r in mine], marker="o",
                        label=f"{arm} (largest load solved: {solved_text(arm, rows, largest[arm])})")[0]
        ax1.scatter([p["load"] * shift for p in pts], [p[METRIC] for p in pts], s=10, alpha=0.5,
                    color=line.get_color())
        ax2.plot(loads, [r["reached"] / r["runs"] for r in mine], marker="o", label=arm)
    ticks = sorted({r["load"] for r in rows})
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("key-value pairs per sequence (load)")
    ax1.set_ylabel(f"final {METRIC} (every tested run; line: mean)")
    ax2.set_ylabel("share of runs reaching the threshold")
    ax2.set_ylim(-0.05, 1.05)
    ax2.legend(fontsize=7)
    fig.legend(*ax1.get_legend_handles_labels(), loc="lower center", fontsize=7, frameon=False)  # long labels:
    fig.tight_layout(rect=(0, 0.06 * len(arms), 1, 0.97))  # below both panels, whole; the machines above
    fig.savefig(path, dpi=120)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("loads", nargs="+", help="LOAD:DIR, one per load")
    ap.add_argument("--solved", default="7/8", help="share of an arm's tested runs reaching the threshold")
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args(argv)
    try:
        solved = Fraction(args.solved)
    except ValueError:
        sys.exit(f"--solved {args.solved!r}: give a share such as 7/8 or 0.875")
    if not 0 < solved <= 1:
        sys.exit(f"--solved {args.solved}: the share must be in (0, 1]")
    points = read(args.loads)
    rows, largest = curve(points, solved)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "capacity_curve.csv", COLUMNS, rows)
    write_csv(args.out / "capacity_points.csv", ["arm", "load", "seed", "reached", METRIC, "ran_on"], points)
    plot(points, rows, largest, args.out / "capacity_curve.png")
    for arm, load in largest.items():
        print(f"{arm}: largest load solved {solved_text(arm, rows, load)}")
    print(f"ran on {ran_on(points)}")
    print(f"wrote {args.out}/capacity_curve.csv, capacity_points.csv and capacity_curve.png")


if __name__ == "__main__":
    main(sys.argv[1:])
