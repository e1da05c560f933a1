"""Exploratory, not a verdict: kv_lr_curve's steps to 0.9 with its three numerics pooled, and the seeds a follow-up
would need.

The design's verdicts are per numerics (10 fresh runs an arm each; README). MQA's median steps lay above MHA's under
every numerics without separating; this pools the 30 tested runs an arm (unstratified: MHA's medians were 1300, 1300
and 1400 under the three numerics) for the log-rank test the report uses, and estimates by resampling the pooled
runs the power of a declared follow-up on n fresh seeds an arm at Holm's first threshold over the report's three
endpoints (0.05 / 3). The pooled runs chose this question, so its p is no test of it, and its effect is likely an
overestimate (the power is given also at three quarters of it, in log steps).

    python experiments/kv_lr_curve/pooled.py      # writes experiments/kv_lr_curve/pooled.md
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from mhalab import stats
from mhalab.tables import Table, fmt_p

HERE = Path(__file__).resolve().parent
NUMERICS = {"B": "results", "scalar": "results-scalar", "threads2": "results-threads2"}
BASELINE = "attention.n_kv_heads=4"
ARMS = ["attention.n_kv_heads=2", "attention.n_kv_heads=1"]
SIMULATIONS, ARRANGEMENTS = 1000, 2000  # resampled follow-ups; random label arrangements of each one's log-rank
FOLLOW_UP = (30, 40, 50)  # fresh seeds an arm


def tested_steps() -> dict[str, dict[str, list[tuple[float, bool]]]]:
    """numerics -> arm -> (steps to the threshold or the steps run, reached) of each run in the verdicts."""
    out: dict[str, dict[str, list[tuple[float, bool]]]] = {}
    for name, folder in NUMERICS.items():
        for row in csv.DictReader((HERE / folder / "runs.csv").open()):
            if row["in_verdicts"] == "True":
                reached = row["reached"] == "True"
                steps = float(row["threshold_step"] if reached else row["steps"])
                out.setdefault(name, {}).setdefault(row["arm"], []).append((steps, reached))
    return out


def median(runs: list[tuple[float, bool]]) -> str:
    """The Kaplan-Meier median steps, as the reports give it."""
    m = stats.kaplan_meier([s for s, _ in runs], [r for _, r in runs])["median"]
    return "not reached" if m is None else f"{m:.0f}"


def logrank_p(a: list[tuple[float, bool]], b: list[tuple[float, bool]],
              arrangements: int | None = None) -> float:
    return stats.logrank([s for s, _ in a], [r for _, r in a], [s for s, _ in b], [r for _, r in b],
                         arrangements)["p"]


def power(arm: list[tuple[float, bool]], base: list[tuple[float, bool]], n: int, shrink: float,
          rng: np.random.Generator) -> float:
    """Share of resampled follow-ups (n runs an arm, drawn from the pooled runs; the arm's log steps moved towards the
    baseline's by 1 - shrink) whose log-rank p is below 0.05 / 3."""
    log_gap = np.mean([np.log(s) for s, _ in arm]) - np.mean([np.log(s) for s, _ in base])
    moved = [(float(np.round(s * np.exp(-(1 - shrink) * log_gap) / 100) * 100), r) for s, r in arm]  # val every 100
    hits = sum(logrank_p([moved[i] for i in rng.integers(0, len(moved), n)],
                         [base[i] for i in rng.integers(0, len(base), n)], ARRANGEMENTS) < 0.05 / 3
               for _ in range(SIMULATIONS))
    return hits / SIMULATIONS


def main() -> None:
    runs = tested_steps()
    pooled = {arm: [r for name in NUMERICS for r in runs[name][arm]] for arm in [BASELINE, *ARMS]}
    rng = np.random.default_rng(0)
    lines = ["# kv_lr_curve: the three numerics pooled (exploratory, not a verdict)", "",
             "`python experiments/kv_lr_curve/pooled.py`, from the runs.csv of results/, results-scalar/ and "
             "results-threads2/ (the runs in each report's verdicts). Log-rank with a permutation p "
             f"({stats.ENUMERATE_MAX:,} random arrangements, as `mhalab report`), unstratified; power by resampling "
             f"the pooled runs ({SIMULATIONS} follow-ups of n runs an arm, each tested with {ARRANGEMENTS:,} "
             "arrangements) at 0.05 / 3, Holm's first threshold over a report's three endpoints.", ""]
    t = Table(["arm vs baseline", "median steps (Kaplan-Meier) B / scalar / threads2", "pooled median",
               "geometric-mean ratio", "pooled log-rank p",
               *(f"power at n = {n} (observed; 3/4 effect)" for n in FOLLOW_UP)])
    base = pooled[BASELINE]
    for arm in ARMS:
        medians = " / ".join(f"{median(runs[name][arm])} vs {median(runs[name][BASELINE])}" for name in NUMERICS)
        ratio = np.exp(np.mean([np.log(s) for s, _ in pooled[arm]]) - np.mean([np.log(s) for s, _ in base]))
        pw = [f"{power(pooled[arm], base, n, 1.0, rng):.2f}; {power(pooled[arm], base, n, 0.75, rng):.2f}"
              for n in FOLLOW_UP]
        t.add([f"{arm} vs {BASELINE}", medians, f"{median(pooled[arm])} vs {median(base)}", f"{ratio:.2f}",
               fmt_p(logrank_p(pooled[arm], base)), *pw])
    lines.append(t.markdown())
    reached = all(r for arm in pooled.values() for _, r in arm)
    lines += ["", f"Runs pooled: {len(base)} an arm; every one reached the threshold: {reached}. The pooled runs "
              "chose this question after each numerics' verdict was read, so the pooled p tests nothing; a follow-up "
              "declared before its runs, on fresh seeds, would."]
    (HERE / "pooled.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
