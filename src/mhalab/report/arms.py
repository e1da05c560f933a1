"""Arms, their tuning and their comparisons: what a report concludes from its runs.

An arm is a configuration (its overrides minus seed and the tuned keys); a cell is an arm at one value of the tuned
keys (e.g. `optim.lr`). Each arm is reported at its best cell **on validation** (the highest rate of runs reaching
the endpoint threshold, then the fewest steps to it, then the best mean metric), and compared with the baseline arm
at its best cell on three endpoints, each with the test that fits it (`mhalab.stats`):

- the rate of runs that reached the threshold (the exact unconditional score test and its inverted interval; the
  detectable difference),
- the steps to the threshold, censored at the budget (Kaplan-Meier medians; log-rank with an exact permutation p),
- the final metric on the test split (exact permutation test, or the exact sign-flip test when the two arms share
  their architecture and seeds, so the same seed gives them the same initialisation and the same data order).
Holm's correction runs over every p of the report. An experiment that declares `endpoint.selection_seeds` (stage A)
has each arm's value chosen on those seeds only and frozen; its comparisons use only the other seeds (stage B), so no
selection seed is ever in a verdict.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from mhalab import stats as inf
from mhalab.errors import ConfigError
from mhalab.report.runs import Run, better, design, seed_order

HEAD_STATS = ("entropy_norm", "first_token", "distance", "confidence", "importance")


@dataclass
class Cell:
    """One arm at one value of the tuned keys: its runs in seed order."""

    cell: tuple[str, ...]
    runs: list[Run]
    metric: str

    @property
    def label(self) -> str:
        return ", ".join(self.cell) or "-"

    @property
    def seeds(self) -> list:
        return [r.seed for r in self.runs]

    def values(self, metric: str | None = None) -> list[float | None]:
        return [r.value(metric or self.metric) for r in self.runs]

    def at_stage(self, stage: str) -> Cell:
        """This cell with the runs of one stage only ('A' chooses, 'B' tests); runs of an experiment that declared no
        stages ('A+B') are in both."""
        return Cell(self.cell, [r for r in self.runs if r.stage in (stage, "A+B")], self.metric)

    def threshold(self) -> float | None:
        return self.runs[0].endpoint.get("threshold")

    def rate(self) -> tuple[int, int] | None:
        if self.threshold() is None:
            return None
        return sum(bool(r.reached()) for r in self.runs), len(self.runs)

    def km(self) -> dict | None:
        if self.threshold() is None:
            return None
        return inf.kaplan_meier([r.steps() for r in self.runs], [bool(r.reached()) for r in self.runs])

    def rank_key(self) -> tuple:
        """Best first: reached more often, sooner, then the better mean metric."""
        vals = [v for v in self.values() if v is not None]
        mean = sum(vals) / len(vals) if vals else math.inf
        mean_key = better(self.metric)(mean) if vals else math.inf
        rate = self.rate()
        if rate is None:
            return (mean_key,)
        median = self.km()["median"]
        return (-rate[0] / rate[1], median if median is not None else math.inf, mean_key)


@dataclass
class Arm:
    key: tuple[str, ...]
    label: str
    cells: dict[tuple, Cell] = field(default_factory=dict)

    @property
    def chosen(self) -> Cell:
        """The cell ranked best on the selection runs (stage A) only: fresh runs (stage B) never change the choice."""
        cells = list(self.cells.values())
        if len(cells) == 1:
            return cells[0]
        ranked = [c for c in cells if c.at_stage("A").runs]
        if not ranked:
            raise ConfigError(f"arm {self.label} has {len(cells)} tuned values and no stage-A run (a seed in "
                              "endpoint.selection_seeds) to choose among them: report the selection runs too")
        return min(ranked, key=lambda c: c.at_stage("A").rank_key())

    @property
    def design(self) -> dict[str, Any]:
        return design(self.chosen.runs[0].summary)


def arms_of(runs: list[Run], metric: str) -> list[Arm]:
    """The arms, ordered by head count, then MHA -> GQA -> MQA, head width and label."""
    keys = list(dict.fromkeys(r.arm for r in runs))
    values = [dict(o.split("=", 1) for o in k if "=" in o) for k in keys]
    all_keys = list(dict.fromkeys(k for v in values for k in v))
    swept = [k for k in all_keys if len({v.get(k) for v in values}) > 1]
    arms = {k: Arm(k, ", ".join(f"{s}={v[s]}" for s in swept if s in v) or ", ".join(k) or "default")
            for k, v in zip(keys, values)}
    for r in runs:
        cell = arms[r.arm].cells.setdefault(r.cell, Cell(r.cell, [], metric))
        cell.runs.append(r)
    for arm in arms.values():
        for cell in arm.cells.values():
            cell.runs.sort(key=lambda r: seed_order(r.seed))
            twice = sorted(s for s, n in Counter(map(str, cell.seeds)).items() if n > 1)
            if twice:
                raise ConfigError(f"arm {arm.label or '-'} at {cell.label} has two runs of seed {', '.join(twice)}: "
                                  "report one sweep of each design, not a sweep and its rerun (or a --same-arm key "
                                  "joined arms that share seeds)")

    def order(a: Arm) -> tuple:
        d = a.design
        num = lambda k: d[k] if isinstance(d.get(k), (int, float)) else 0  # noqa: E731
        return (num("n_heads"), -num("n_kv_heads"), num("d_head"), num("d_ff"), a.label)

    return sorted(arms.values(), key=order)


def pick_baseline(arms: list[Arm], baseline: str | None) -> Arm:
    if baseline is None:
        return arms[0]
    for a in arms:
        if a.label == baseline or baseline in a.key:
            return a
    raise ConfigError(f"--baseline {baseline!r} is not an arm of these runs; they are: "
                      f"{'; '.join(a.label for a in arms)}")


def compare(arm: Arm, base: Arm, metric: str) -> list[dict]:
    """The comparisons of `arm` with `base` at their chosen cells, one per endpoint, on the test runs (stage B)."""
    a, b = arm.chosen.at_stage("B"), base.chosen.at_stage("B")
    out = []
    common = {"arm": arm.label, "baseline": base.label, "arm_cell": a.label, "baseline_cell": b.label}
    if not a.runs or not b.runs:
        return [{**common, "endpoint": "every endpoint", "estimate": None, "ci95_low": None, "ci95_high": None,
                 "test": "-", "p": None, "p_min": None, "detectable": None,
                 "degenerate": "no fresh (stage B) run at the chosen value: no test",
                 "arm_value": f"{len(a.runs)} runs", "baseline_value": f"{len(b.runs)} runs"}]
    rate_a, rate_b = a.rate(), b.rate()
    if rate_a and rate_b:
        r = inf.compare_rates(rate_a[0], rate_a[1], rate_b[0], rate_b[1])
        out.append({**common, "endpoint": f"rate reaching {metric} {_cmp(metric)} {a.threshold():g}",
                    "estimate": r["diff"], "ci95_low": r["ci95_low"], "ci95_high": r["ci95_high"], "test": r["test"],
                    "p": r["p"], "p_min": r["p_min"], "detectable": r["detectable"],
                    "arm_value": f"{rate_a[0]}/{rate_a[1]}", "baseline_value": f"{rate_b[0]}/{rate_b[1]}"})
        lr = inf.logrank([x.steps() for x in a.runs], [bool(x.reached()) for x in a.runs],
                         [x.steps() for x in b.runs], [bool(x.reached()) for x in b.runs])
        ka, kb = a.km(), b.km()
        out.append({**common, "endpoint": "steps to the threshold (Kaplan-Meier median)",
                    "estimate": None, "ci95_low": None, "ci95_high": None, "test": lr["test"], "p": lr["p"],
                    "p_min": lr["p_min"], "detectable": None, "degenerate": lr.get("degenerate"),
                    # + = the arm takes more steps (fewer threshold crossings than expected under the log-rank)
                    "direction": None if lr.get("excess") is None else -lr["excess"],
                    "arm_value": median_text(ka), "baseline_value": median_text(kb)})
    final = metric.replace("val/", "test/", 1)
    if any(v is None for v in a.values(final) + b.values(final)):
        final = metric
    out.append({**common, "endpoint": f"final {final}", **_difference(a, b, final)})
    return out


def _difference(a: Cell, b: Cell, metric: str) -> dict:
    same_arch = a.runs[0].summary.architecture == b.runs[0].summary.architecture
    va, vb = dict(zip(map(str, a.seeds), a.values(metric))), dict(zip(map(str, b.seeds), b.values(metric)))
    shared = [s for s in va if s in vb and va[s] is not None and vb[s] is not None]
    if same_arch and len(shared) >= 2:
        c = inf.paired([va[s] - vb[s] for s in shared])
        why = "paired by seed: same architecture, so the same initialisation and data order"
    else:
        c = inf.two_sample([v for v in va.values() if v is not None], [v for v in vb.values() if v is not None])
        why = ("unpaired: the arms' parameter shapes differ, so a seed gives them different initialisations"
               if not same_arch else "unpaired: fewer than 2 seeds in common")
    return {"estimate": c.mean, "ci95_low": c.ci95_low, "ci95_high": c.ci95_high, "test": f"{c.test}; {why}",
            "p": c.p, "p_min": c.p_min, "detectable": c.mde80, "degenerate": c.degenerate,
            "arm_value": _mean_str(a.values(metric)), "baseline_value": _mean_str(b.values(metric))}


def apply_holm(comparisons: list[dict]) -> None:
    """Holm-adjust every p of the report and write each comparison's verdict."""
    tested = [c for c in comparisons if c.get("p") is not None]
    floors = [c["p_min"] for c in tested if c.get("p_min") is not None]
    # Holm multiplies the smallest p by the number of p-values: below that floor nothing can be separated
    holm_floor = len(tested) * min(floors) if floors and len(floors) == len(tested) else None
    for c, adj in zip(comparisons, inf.holm([c.get("p") for c in comparisons])):
        c["p_holm"] = adj
        c["verdict"] = verdict(c, holm_floor, len(tested))


def verdict(c: dict, holm_floor: float | None = None, k: int = 1) -> str:
    """The verdict in words; a design too small to separate anything says so (it needs more seeds)."""
    if c.get("degenerate"):
        return c["degenerate"]
    if c.get("p") is None:
        return "too few runs for a test"
    if c["p_holm"] < inf.ALPHA:
        return "separated"
    if c.get("p_min") is not None and c["p_min"] >= inf.ALPHA:
        return f"not separable: this design's smallest p is {c['p_min']:.2g}; it needs more seeds"
    if holm_floor is not None and holm_floor >= inf.ALPHA:
        return (f"not separable: Holm over {k} p-values puts every adjusted p at {holm_floor:.2g} or more; it needs "
                "more seeds")
    det = c.get("detectable")
    if c["endpoint"].startswith("rate"):
        return "not separated; " + ("no difference in rates is detectable at 80% power" if det is None else
                                    f"detectable difference at 80% power: {det:.2f}")
    return "not separated" + (f"; detectable effect (80% power, t): {det:.3g}" if det is not None else "")


def head_stats(cell: Cell) -> dict[str, tuple]:
    """Per head statistic: (mean, 95% interval) over the cell's runs of each run's mean over layers and heads."""
    out = {}
    for stat in HEAD_STATS:
        per_run = []
        for r in cell.runs:
            m = r.summary.head_importance if stat == "importance" else r.summary.head_stats.get(stat)
            vals = [v for row in (m or []) for v in row if v is not None]
            if vals:
                per_run.append(sum(vals) / len(vals))
        if per_run:
            out[stat] = inf.mean_ci(per_run)
    return out


def _cmp(metric: str) -> str:
    return "<=" if inf.lower_is_better(metric) else ">="


def median_text(km: dict) -> str:
    """A Kaplan-Meier median with its interval, or why there is none."""
    if km["median"] is None:
        return f"not reached ({km['events']}/{km['n']})"
    if not km.get("has_ci", True):
        return f"{km['median']:g} (no interval below {inf.KM_CI_MIN_RUNS} runs)"
    hi = "not reached" if km["median_ci95_high"] is None else f"{km['median_ci95_high']:g}"
    lo = "-" if km["median_ci95_low"] is None else f"{km['median_ci95_low']:g}"
    return f"{km['median']:g} [{lo}, {hi}]"


def _mean_str(values: list) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    mean, lo, hi = inf.mean_ci(vals)
    return f"{mean:.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if lo is not None else "")
