"""The report's pictures: each arm's metric and reaching rate against the tuned value, learning curves, the
fraction of runs that reached the threshold by each step, the final metric per arm with every run shown, and the
head statistics per arm. Colours identify arms in every picture; a legend sits outside the data."""

from __future__ import annotations

from pathlib import Path

from mhalab import stats as inf
from mhalab.report.arms import Arm, Cell, head_stats
from mhalab.report.runs import key_of


def short(label: str) -> str:
    """An arm's label without its config groups' names: attention.n_kv_heads=4 -> n_kv_heads=4; only the group is
    dropped, so model.param_match.d_head=64 stays param_match.d_head=64 (not d_head=64, another arm's name)."""
    return ", ".join(part.strip().split("=", 1)[0].split(".", 1)[-1] + ("=" + part.split("=", 1)[1] if "=" in part
                                                                         else "") for part in label.split(","))


# what stats.mean_ci draws (the report's interval of one arm's mean), named on every figure that shows it
INTERVAL = inf.MEAN_CI_NAME


def tested(a: Arm) -> Cell:
    """The runs an arm's comparisons use: its fresh (stage B) runs at the chosen cell, or every run there when none is
    fresh (a stage-A report, or an experiment without stages)."""
    fresh = a.chosen.at_stage("B")
    return fresh if fresh.runs else a.chosen


def arm_name(a: Arm) -> str:
    """An arm in a legend: its short label, and its chosen cell's when a key was tuned."""
    cell = a.chosen.label
    return short(a.label) + (f" ({short(cell)})" if cell != "-" else "")


FAR = 2.0  # a reference level further from the data than FAR x their span is named, not drawn


def reference_lines(ax, levels: dict | None, metric: str) -> None:
    """The task's reference levels of `metric` (chance, majority, ...: summary.json's baselines) as labelled
    dotted lines; their labels go to the axis' legend. A level far off the data (FAR) is named in the legend with
    the side it lies on, not drawn: its line would squeeze the runs into a thin band."""
    styles = [":", "-.", (0, (1, 3)), (0, (5, 2))]
    shown = [(name, value) for name, value in (levels or {}).items()
             if value is not None and name.endswith(metric.rsplit("/", 1)[-1])]
    lo, hi = ax.dataLim.y0, ax.dataLim.y1
    span = hi - lo if ax.has_data() and hi > lo else None
    for i, (name, value) in enumerate(shown):
        label = f"{name.replace('_', ' ')}: {value:.3g}"
        if span is not None and min(abs(value - lo), abs(value - hi)) > FAR * span and not lo <= value <= hi:
            ax.plot([], [], color="grey", ls=styles[i % len(styles)], lw=1.2,
                    label=f"{label} ({'above' if value > hi else 'below'} the scale)")
            continue
        ax.axhline(value, color="grey", ls=styles[i % len(styles)], lw=1.2, label=label)


def _fig(w: float, h: float):
    from mhalab.pictures import new_figure

    return new_figure(figsize=(w, h))


def _colors(arms: list[Arm]) -> dict[str, str]:
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
    return {a.label: palette[i % len(palette)] for i, a in enumerate(arms)}


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def _numeric_cell(cell: tuple[str, ...]) -> float | None:
    """The value of a single numeric tuned key (e.g. optim.lr=0.001 -> 0.001)."""
    if len(cell) != 1:
        return None
    try:
        return float(cell[0].split("=", 1)[1])
    except (IndexError, ValueError):
        return None


def tuning(arms: list[Arm], metric: str, out: Path) -> Path | None:
    """Per arm: the rate of runs reaching the threshold (Clopper-Pearson 95%) and the mean metric against the
    tuned value; the chosen value of each arm circled."""
    if not all(_numeric_cell(c) is not None for a in arms for c in a.cells) or max(len(a.cells) for a in arms) < 2:
        return None
    colors = _colors(arms)
    has_rate = arms[0].chosen.rate() is not None
    fig = _fig(11 if has_rate else 6, 4)
    axes = fig.subplots(1, 2 if has_rate else 1, squeeze=False)[0]
    name = key_of(next(iter(arms[0].cells))[0])
    for i, a in enumerate(arms):
        cells = sorted(a.cells.values(), key=lambda c: _numeric_cell(c.cell))
        xs = [_numeric_cell(c.cell) * (1 + 0.04 * (i - len(arms) / 2)) for c in cells]  # offset: bars apart
        chosen_x = xs[cells.index(a.chosen)]
        ax = axes[-1]
        means = [inf.mean_ci([v for v in c.values() if v is not None]) for c in cells]
        ax.errorbar(xs, [m[0] for m in means], yerr=_err(means), marker="o", capsize=3, color=colors[a.label],
                    label=short(a.label))
        ax.plot([chosen_x], [means[cells.index(a.chosen)][0]], "o", ms=13, mfc="none", color=colors[a.label])
        if has_rate:
            rates = [inf.rate(*c.rate()) for c in cells]
            axes[0].errorbar(xs, [r[0] for r in rates], yerr=_err(rates), marker="o", capsize=3,
                             color=colors[a.label], label=a.label)
            axes[0].plot([chosen_x], [rates[cells.index(a.chosen)][0]], "o", ms=13, mfc="none",
                         color=colors[a.label])
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel(name)
        ax.grid(alpha=0.3)
    axes[-1].set_ylabel(f"final {metric}: mean and\n{INTERVAL} (runs <2: none)", fontsize=8)
    if has_rate:
        axes[0].set_ylabel(f"runs reaching {metric} {arms[0].chosen.threshold():g} (95% CP)")
        axes[0].set_ylim(-0.05, 1.05)
    axes[-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), title="arm (circled: chosen)")
    fig.suptitle(f"each arm against {name}", fontsize=10)
    return _save(fig, out / "tuning.png")


def curves(arms: list[Arm], metric: str, out: Path) -> Path | None:
    """The metric at every validation of every tested run at its arm's chosen cell (`tested`: the same runs as the
    comparisons); the arm's median over runs bold."""
    import numpy as np

    colors = _colors(arms)
    fig = _fig(8, 4.5)
    ax = fig.add_subplot()
    drawn = False
    for a in arms:
        runs = [r for r in tested(a).runs if metric in (r.summary.history or {})]
        steps = sorted({s for r in runs for s in r.summary.history["step"]})
        marker = "o" if len(steps) <= 20 else None  # a few validations (one: a lone point) stay visible
        for r in runs:
            ax.plot(r.summary.history["step"], r.summary.history[metric], color=colors[a.label], alpha=0.25, lw=0.8,
                    marker=marker, ms=3)
        if runs:
            grid = np.array([[_carry(r.summary.history, metric, s) for s in steps] for r in runs])
            ax.plot(steps, np.median(grid, axis=0), color=colors[a.label], lw=2.2, marker=marker,
                    label=f"{arm_name(a)}: median of {len(runs)} run{'s' * (len(runs) != 1)}")
            drawn = True
    if not drawn:
        return None
    threshold = arms[0].chosen.threshold()
    if threshold is not None:
        ax.axhline(threshold, color="grey", ls="--", lw=1, label=f"threshold {threshold:g}")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    ax.set_title("learning curves at each arm's chosen cell (thin: runs; a run that stopped at the threshold "
                 "keeps its last value)", fontsize=9)
    return _save(fig, out / "curves.png")


def _carry(history: dict, metric: str, step: float) -> float:
    """The metric at `step`, or the last value before it (a run that stopped early keeps it)."""
    value = history[metric][0]
    for s, v in zip(history["step"], history[metric]):
        if s <= step:
            value = v
    return value


def reached(arms: list[Arm], out: Path) -> Path | None:
    """Kaplan-Meier: the fraction of runs that reached the threshold by each step, per arm, over the runs its
    comparisons use (`tested`), so each median is the table's."""
    cells = [tested(a) for a in arms]
    kms = [c.km() for c in cells]
    if kms[0] is None:
        return None
    colors = _colors(arms)
    fig = _fig(8, 4)
    ax = fig.add_subplot()
    for a, cell, km in zip(arms, cells, kms):
        budget = max(r.steps() for r in cell.runs)
        xs, ys = km["steps"] + [budget], [1 - s for s in km["survival"]] + [1 - km["survival"][-1]]
        ax.step(xs, ys, where="post", color=colors[a.label], lw=2, label=f"{arm_name(a)}: median {_med(km)}")
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("fraction of runs that reached the threshold")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    ax.set_title("steps to the threshold (Kaplan-Meier, censored at the budget)", fontsize=9)
    return _save(fig, out / "reached.png")


def _med(km: dict) -> str:
    return "not reached" if km["median"] is None else f"{km['median']:g}"


def final(arms: list[Arm], metric: str, out: Path, levels: dict | None = None) -> Path:
    """The final metric of every run at the chosen cells: the runs the comparisons test (filled dots) with their mean
    and interval (stats.mean_ci; none with fewer than 2 runs), and, where the experiment declared stages, the stage-A
    runs that chose the value (hollow dots, outside the mean); the task's reference levels as labelled lines."""
    colors = _colors(arms)
    fig = _fig(max(6.0, 1.3 * len(arms) + 3), 4.2)
    ax = fig.add_subplot()
    ticks, chose_label = [], "stage A: chose the value, not tested"
    for i, a in enumerate(arms):
        fresh = a.chosen.at_stage("B")
        chose = [r for r in a.chosen.runs if r.stage == "A"]
        ticks.append(short(a.label) + (f"\n{short(a.chosen.label)}" if a.chosen.label != "-" else "")
                     + f"\n{len(fresh.runs)} runs" + (f" (+{len(chose)} stage A)" if chose else ""))
        if chose:
            vals = [v for v in Cell(a.chosen.cell, chose, a.chosen.metric).values(metric) if v is not None]
            ax.plot([i - 0.2] * len(vals), vals, "o", mfc="none", color=colors[a.label], alpha=0.7, ms=5,
                    label=chose_label)
            chose_label = None  # one legend entry
        vals = [v for v in fresh.values(metric) if v is not None]
        if not vals:
            continue
        jitter = [i + 0.06 * ((k % 5) - 2) for k in range(len(vals))]
        ax.plot(jitter, vals, "o", color=colors[a.label], alpha=0.45, ms=5)
        m, lo, hi = inf.mean_ci(vals)
        ax.errorbar([i + 0.3], [m], yerr=[[m - (lo if lo is not None else m)], [(hi if hi is not None else m) - m]],
                    fmt="s", color="black", capsize=4, label=f"mean and {INTERVAL}" if i == 0 else None)
    reference_lines(ax, levels, metric)
    ax.set_xticks(range(len(arms)), ticks, fontsize=7)
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    ax.set_title("every tested run (dots) and the arm's mean (squares; bars: the interval, none for a single run)",
                 fontsize=9)
    return _save(fig, out / "final.png")


def heads(arms: list[Arm], out: Path) -> Path | None:
    """Head statistics per arm: each run's mean over layers and heads, the arm's mean and 95% interval."""
    from matplotlib.ticker import MaxNLocator

    stats = {a.label: head_stats(a.chosen) for a in arms}
    # importance is normalised per layer, so its mean over heads says little across arms: the table has it
    names = [s for s in ("entropy_norm", "first_token", "distance", "confidence") if any(s in v for v in stats.values())]
    if not names:
        return None
    colors = _colors(arms)
    fig = _fig(3.4 * len(names) + 1, 3.8)
    axes = fig.subplots(1, len(names), squeeze=False)[0]
    fig.subplots_adjust(wspace=0.45, bottom=0.3, top=0.76)  # the two-line title above the panels' own
    for ax, name in zip(axes, names):
        for i, a in enumerate(arms):
            if name in stats[a.label]:
                m, lo, hi = stats[a.label][name]
                ax.errorbar([i], [m], yerr=[[m - (lo if lo is not None else m)], [(hi if hi is not None else m) - m]],
                            fmt="o", capsize=4, color=colors[a.label])
        ax.set_xticks(range(len(arms)), [f"{short(a.label)} ({len(a.chosen.runs)} runs)" for a in arms],
                      rotation=30, ha="right", fontsize=7)
        ax.set_xlim(-0.5, len(arms) - 0.5)
        ax.yaxis.set_major_locator(MaxNLocator(5))
        ax.set_title(name + (" (tokens)" if "distance" in name else ""), fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"head statistics at the end of training: each arm's mean over runs of the mean over layers and "
                 f"heads,\nwith the {INTERVAL} over runs (none for a single run)", fontsize=9)
    return _save(fig, out / "heads.png")


def _err(triples) -> list[list[float]]:
    return [[m - (lo if lo is not None else m) for m, lo, _ in triples],
            [(hi if hi is not None else m) - m for m, _, hi in triples]]
