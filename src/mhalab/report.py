"""Sweep reports: `mhalab report <multirun_dir> ... [--baseline LABEL] [--metric KEY] [--out DIR] [--wandb]`.

Reads every run of the given folders through the run contract (`mhalab.summary.read_summary`; a damaged or foreign
file is listed as failed, never trusted), groups the runs into configurations (a run's overrides minus `seed`) and
writes into `--out` (default `<first dir>/report`):

- `report.md`: one row per configuration: its design (n_heads, n_kv_heads, d_head, d_ff, parameters, forward
  FLOPs/token, KV-cache bytes/token), the metric's mean with a 95% t-interval over seeds, and the **paired**
  difference from the baseline configuration on the same seeds with its 95% CI, p, the minimum detectable effect
  at 80% power and a verdict (separated: the CI excludes 0; `mhalab.inference`); then failed jobs;
- `report.csv`: the same, unformatted, plus one column per seed (`seed_<s>`) and `ci95_low` / `ci95_high` of the
  paired difference;
- plots of the metric against each swept size (mean and 95% CI, each seed as a faint line) with the task's chance,
  majority and unigram levels as horizontal lines where the runs recorded them.

The metric is `val/acc` (higher is better) for classification and synthetic tasks and `val/bpb` (bits per byte,
lower is better) for text language modelling, unless `--metric` names another key of the summaries' metrics.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from mhalab.errors import ConfigError
from mhalab.inference import lower_is_better, mean_ci, paired
from mhalab.summary import SUMMARY, RunSummary, read_summary

IGNORED_KEYS = ("seed", "resume", "fault.", "hydra.", "hydra/")
DESIGN = ("n_heads", "n_kv_heads", "d_head", "d_model", "d_ff", "n_layers")
COST = ("params", "flops_per_token", "attention_flops_per_token", "kv_cache_bytes_per_token")


def _seed_order(seed) -> tuple:
    """Sort key: seeds in numeric order (0, 1, 2, 10), anything else after them."""
    return (0, seed, "") if isinstance(seed, int) else (1, 0, str(seed))


CSV_COLUMNS = (["config", "task", *DESIGN, *COST, "n_seeds", "seeds", "metric", "mean", "mean_ci95_low",
                "mean_ci95_high", "sd", "baseline", "diff", "ci95_low", "ci95_high", "p", "mde80", "verdict",
                "test_metric", "test_mean", "test_ci95_low", "test_ci95_high", "train_steps", "tokens_per_s",
                "fit_s"])


# -- reading ------------------------------------------------------------------------------------------------

def find_runs(dirs: list[Path]) -> tuple[list[tuple[Path, RunSummary]], list[dict]]:
    """(readable runs, failed jobs) under `dirs`: every summary.json, and every Hydra job folder without one."""
    runs, failed, seen = [], [], set()
    for d in dirs:
        d = Path(d)
        if not d.is_dir():
            raise ConfigError(f"{d} is not a directory (give a multirun directory, e.g. "
                              "logs/kv_sweep/multiruns/<id>)")
        for path in sorted(d.rglob(SUMMARY)):
            job = path.parent
            if "report" in job.relative_to(d).parts or job in seen:
                continue
            seen.add(job)
            try:
                s = read_summary(job)
            except ConfigError as e:
                failed.append({"dir": str(job), "overrides": [], "kind": "unreadable", "error": str(e)})
                continue
            if s.status == "ok":
                runs.append((job, s))
            else:
                failed.append({"dir": str(job), "overrides": s.overrides, "kind": (s.error or {}).get("kind", s.status),
                               "error": (s.error or {}).get("message", s.status)})
        for hydra_dir in sorted(d.rglob(".hydra")):
            job = hydra_dir.parent
            if job not in seen and job != d and (hydra_dir / "overrides.yaml").is_file():
                seen.add(job)
                failed.append({"dir": str(job), "overrides": [], "kind": "missing",
                               "error": "no summary.json (the job was killed or is still running)"})
    if not runs and not failed:
        raise ConfigError(f"no summary.json under {', '.join(map(str, dirs))}: run a sweep first "
                          "(mhalab train -m experiment=kv_sweep)")
    return runs, failed


def config_key(overrides: list[str]) -> tuple[str, ...]:
    """The configuration a run belongs to: its overrides without seed, resume, faults and Hydra's own."""
    return tuple(sorted(o for o in overrides if not o.split("=", 1)[0].lstrip("+~").startswith(IGNORED_KEYS)))


def default_metric(s: RunSummary) -> str:
    return "val/bpb" if "val/bpb" in s.metrics else "val/acc"


def design(s: RunSummary) -> dict[str, Any]:
    """The resolved sizes of a run's model (from the architecture it recorded, never re-derived)."""
    m, a = s.architecture.get("model", {}), s.architecture.get("attention", {})
    return {"n_heads": a.get("n_heads"), "n_kv_heads": a.get("n_kv_heads"), "d_head": a.get("d_head"),
            "d_model": m.get("d_model"), "d_ff": m.get("d_ff"), "n_layers": m.get("n_layers")}


# -- aggregation --------------------------------------------------------------------------------------------

def aggregate(runs: list[tuple[Path, RunSummary]], metric: str | None = None) -> tuple[list[dict], list[str]]:
    """(one row per configuration, the swept override keys)."""
    groups: dict[tuple, list[tuple[Path, RunSummary]]] = {}
    for job, s in runs:
        groups.setdefault(config_key(s.overrides), []).append((job, s))
    values = [dict(o.split("=", 1) for o in key if "=" in o) for key in groups]
    all_keys = list(dict.fromkeys(k for v in values for k in v))
    swept = [k for k in all_keys if len({v.get(k) for v in values}) > 1]
    rows = []
    for key, members in groups.items():
        first = members[0][1]
        kv = dict(o.split("=", 1) for o in key if "=" in o)
        m = metric or default_metric(first)
        test_m = m.replace("val/", "test/") if m.startswith("val/") else None
        per_seed = dict(sorted(((s.config.get("seed"), s.metric(m)) for _, s in members),
                               key=lambda item: _seed_order(item[0])))
        vals = [v for v in per_seed.values() if v is not None]
        if not vals:
            raise ConfigError(f"--metric {m!r}: no run of configuration {', '.join(key) or 'default'} recorded it; "
                              f"its metrics are {', '.join(sorted(first.metrics))}")
        mean, lo, hi = mean_ci(vals)
        tests = [s.metric(test_m) for _, s in members if test_m and s.metric(test_m) is not None]
        t_mean, t_lo, t_hi = mean_ci(tests) if tests else (None, None, None)
        rows.append({
            "config": ", ".join(f"{k}={kv[k]}" for k in swept if k in kv) or ", ".join(key) or "default",
            "task": first.task, **design(first), **{c: first.cost.get(c) for c in COST},
            "n_seeds": len(vals), "seeds": " ".join(str(sd) for sd in per_seed), "per_seed": per_seed,
            "metric": m, "mean": mean, "mean_ci95_low": lo, "mean_ci95_high": hi,
            "sd": statistics.stdev(vals) if len(vals) > 1 else None,
            "test_metric": test_m, "test_mean": t_mean, "test_ci95_low": t_lo, "test_ci95_high": t_hi,
            "train_steps": first.timings.get("train_steps"),
            "tokens_per_s": _mean([s.timings.get("tokens_per_s") for _, s in members]),
            "fit_s": _mean([s.timings.get("fit_s") for _, s in members]),
            "baselines": first.baselines, "run_dirs": [str(j) for j, _ in members]})
    rows.sort(key=_order)
    return rows, swept


def _order(r: dict) -> tuple:
    """Rows by head count, then MHA -> GQA -> MQA, then head width and the rest."""
    num = lambda k: r[k] if isinstance(r.get(k), (int, float)) else 0  # noqa: E731
    return (num("n_heads"), -num("n_kv_heads"), num("d_head"), num("d_ff"), num("d_model"), r["config"])


def _mean(xs) -> float | None:
    xs = [x for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]
    return statistics.fmean(xs) if xs else None


def add_paired(rows: list[dict], baseline: str | None = None) -> dict | None:
    """Each row minus the baseline row on the seeds both have: diff, 95% CI, p, MDE (80% power), verdict.
    Returns the baseline row (the row labelled `baseline`, else the first)."""
    if not rows:
        return None
    base = next((r for r in rows if r["config"] == baseline), None) if baseline is not None else rows[0]
    if base is None:
        raise ConfigError(f"--baseline {baseline!r} is not a configuration of these runs; they are: "
                          f"{'; '.join(r['config'] for r in rows)}")
    for r in rows:
        r["baseline"] = base["config"]
        if r is base:
            continue
        common = [s for s in r["per_seed"] if r["per_seed"][s] is not None and base["per_seed"].get(s) is not None]
        if common and r["metric"] == base["metric"]:
            p = paired([r["per_seed"][s] - base["per_seed"][s] for s in common])
            r.update({"diff": p.mean, "ci95_low": p.ci95_low, "ci95_high": p.ci95_high, "p": p.p, "mde80": p.mde80,
                      "verdict": p.verdict, "n_paired": p.n})
    return base


# -- writing ------------------------------------------------------------------------------------------------

def md_escape(text: Any) -> str:
    """Text for a Markdown table cell: markup characters escaped, one line, bounded length."""
    s = str(text).replace("\r", " ").replace("\n", " ")
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")  # no HTML gets through
    s = "".join("\\" + c if c in "\\|`*[]" else c for c in s)
    return s if len(s) <= 300 else s[:297] + "..."


def _fmt(x: Any, digits: int = 4) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 1e5 else f"{x:.3g}"
    if isinstance(x, int) and abs(x) >= 10000:
        return f"{x:,}"
    return md_escape(x)


def _interval(mean, lo, hi) -> str:
    if mean is None:
        return "-"
    return f"{mean:.4f} [{lo:.4f}, {hi:.4f}]" if lo is not None else f"{mean:.4f} (1 seed)"


def write_csv(rows: list[dict], path: Path) -> None:
    seeds = sorted({s for r in rows for s in r["per_seed"]}, key=_seed_order)
    cols = CSV_COLUMNS + [f"seed_{s}" for s in seeds]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({**{k: ("" if r.get(k) is None else r.get(k)) for k in CSV_COLUMNS},
                        **{f"seed_{s}": r["per_seed"].get(s, "") for s in seeds}})


def markdown(rows: list[dict], failed: list[dict], dirs: list[Path], plots: list[Path], out: Path) -> str:
    lines = ["# Sweep report", "", f"Source: {', '.join(md_escape(d) for d in dirs)}", ""]
    if rows:
        m = rows[0]["metric"]
        better = "lower" if lower_is_better(m) else "higher"
        lines += [f"Metric: `{m}` ({better} is better), the final validation value: mean and 95% t-interval over "
                  f"seeds. Δ: this configuration minus the baseline (`{md_escape(rows[0]['baseline'])}`) on the same "
                  "seeds, with its 95% CI, p (paired t-test) and the minimum detectable effect at 80% power (MDE); "
                  "separated = the CI excludes 0. Test: the tested checkpoint on the test split.", ""]
        header = ["config", "heads", "kv heads", "d_head", "d_ff", "params", "FLOPs/token", "KV bytes/token",
                  "seeds", f"{m}: mean [95% CI]", "Δ vs baseline [95% CI]", "p", "MDE", "verdict", "test [95% CI]"]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for r in rows:
            is_base = r["config"] == r["baseline"]
            delta = "baseline" if is_base else _interval(r.get("diff"), r.get("ci95_low"), r.get("ci95_high"))
            cells = [md_escape(r["config"]), _fmt(r["n_heads"]), _fmt(r["n_kv_heads"]), _fmt(r["d_head"]),
                     _fmt(r["d_ff"]), _fmt(r["params"]), _fmt(r["flops_per_token"]),
                     _fmt(r["kv_cache_bytes_per_token"]), _fmt(r["n_seeds"]),
                     _interval(r["mean"], r["mean_ci95_low"], r["mean_ci95_high"]), delta,
                     "-" if is_base else _fmt(r.get("p"), 2), "-" if is_base else _fmt(r.get("mde80"), 3),
                     "-" if is_base else md_escape(r.get("verdict", "-")),
                     _interval(r["test_mean"], r["test_ci95_low"], r["test_ci95_high"])]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        levels = rows[0].get("baselines") or {}
        if levels:
            lines += ["Reference levels of the task: " + ", ".join(f"{md_escape(k)} {v:.4f}"
                                                                   for k, v in levels.items()) + ".", ""]
    else:
        lines += ["No successful run.", ""]
    lines += [f"## Failed jobs ({len(failed)})", ""]
    if failed:
        lines += ["| job | overrides | kind | error |", "|---|---|---|---|"]
        lines += [f"| {md_escape(Path(f['dir']).name)} | {md_escape(' '.join(f['overrides']))} | "
                  f"{md_escape(f['kind'])} | {md_escape(f['error'])} |" for f in failed]
    else:
        lines.append("None.")
    lines.append("")
    if plots:
        lines += ["## Plots", ""] + [f"![{p.stem}]({p.relative_to(out) if p.is_relative_to(out) else p})"
                                      for p in plots] + [""]
    return "\n".join(lines)


# -- plots --------------------------------------------------------------------------------------------------

LEVEL_STYLE = {"chance": ":", "majority": "--", "unigram": "-."}


def _levels(ax, rows: list[dict], metric: str) -> None:
    """The task's reference levels recorded by the runs, where they are in the plotted metric's units."""
    unit = metric.split("/")[-1]
    for name, value in (rows[0].get("baselines") or {}).items():
        kind, _, level_unit = name.partition("_")
        if level_unit == unit and value is not None:
            ax.axhline(value, color="grey", linestyle=LEVEL_STYLE.get(kind, ":"), linewidth=1, label=name)


def plot_metric(rows: list[dict], x: str, out: Path) -> Path:
    """The metric against one swept size: mean and 95% CI over seeds, each seed faint, reference levels."""
    from mhalab.plots import new_figure

    fig = new_figure(figsize=(6, 4.2))
    ax = fig.add_subplot()
    pts = sorted((r for r in rows if r.get(x) is not None), key=lambda r: r[x])
    xs = [r[x] for r in pts]
    ms = [r["mean"] for r in pts]
    lo = [m - (r["mean_ci95_low"] if r["mean_ci95_low"] is not None else m) for m, r in zip(ms, pts)]
    hi = [(r["mean_ci95_high"] if r["mean_ci95_high"] is not None else m) - m for m, r in zip(ms, pts)]
    line = ax.errorbar(xs, ms, yerr=[lo, hi], marker="o", capsize=4, label="mean, 95% CI over seeds")
    for s in sorted({s for r in pts for s in r["per_seed"]}, key=_seed_order):
        sp = [(r[x], r["per_seed"][s]) for r in pts if r["per_seed"].get(s) is not None]
        if len(sp) > 1:
            ax.plot(*zip(*sp), linestyle=":", linewidth=1, alpha=0.5, color=line[0].get_color())
    _levels(ax, rows, rows[0]["metric"])
    if min(xs) > 0 and len(set(xs)) > 1:
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(v) for v in xs])
    m = rows[0]["metric"]
    ax.set_xlabel(x)
    ax.set_ylabel(f"{m} ({'lower' if lower_is_better(m) else 'higher'} is better)")
    ax.set_title(f"{', '.join(sorted({str(r['task']) for r in rows}))}: {m} vs {x} (dotted: each seed)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / f"metric_vs_{x}.png"
    fig.savefig(path, dpi=110)
    return path


def plot_bars(rows: list[dict], out: Path) -> Path:
    """One bar per configuration (when no size is swept alone)."""
    from mhalab.plots import new_figure

    fig = new_figure(figsize=(max(6.0, 1.4 * len(rows)), 4.5))
    ax = fig.add_subplot()
    ms = [r["mean"] for r in rows]
    err = [[m - (r["mean_ci95_low"] if r["mean_ci95_low"] is not None else m) for m, r in zip(ms, rows)],
           [(r["mean_ci95_high"] if r["mean_ci95_high"] is not None else m) - m for m, r in zip(ms, rows)]]
    ax.bar(range(len(rows)), ms, yerr=err, capsize=4)
    _levels(ax, rows, rows[0]["metric"])
    ax.set_xticks(range(len(rows)), [r["config"] for r in rows], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel(rows[0]["metric"])
    ax.set_title("mean and 95% CI over seeds", fontsize=9)
    fig.tight_layout()
    path = out / "metric_by_config.png"
    fig.savefig(path, dpi=110)
    return path


def make_plots(rows: list[dict], out: Path) -> list[Path]:
    """One plot per size that varies alone across the configurations, else a bar chart."""
    paths = []
    for x in ("n_heads", "n_kv_heads", "d_head"):
        values = {r[x] for r in rows}
        others = {tuple(r[k] for k in ("n_heads", "n_kv_heads", "d_head") if k != x) for r in rows}
        if len(values) > 1 and (len(values) == len(rows) or len(others) == 1):
            paths.append(plot_metric(rows, x, out))
    return paths or ([plot_bars(rows, out)] if rows else [])


# -- wandb --------------------------------------------------------------------------------------------------

def log_wandb(rows: list[dict], failed: list[dict], group: str, project: str, out: Path) -> list[str]:
    """One offline wandb run per configuration (group=`group`) and a `<group>-table` run with the whole table."""
    import wandb

    settings = wandb.Settings(quiet=True, x_disable_stats=True)
    dirs = []
    for r in rows:
        run = wandb.init(project=project, group=group, name=r["config"], job_type="report", dir=str(out),
                         mode="offline", settings=settings, reinit="finish_previous",
                         config={k: r.get(k) for k in ("task", *DESIGN, *COST, "seeds")})
        run.summary.update({k: r[k] for k in CSV_COLUMNS if isinstance(r.get(k), (int, float))})
        dirs.append(run.dir)
        run.finish()
    run = wandb.init(project=project, group=group, name=f"{group}-table", job_type="report-table", dir=str(out),
                     mode="offline", settings=settings, reinit="finish_previous")
    run.log({"report": wandb.Table(columns=CSV_COLUMNS, data=[[r.get(k) for k in CSV_COLUMNS] for r in rows]),
             "n_failed": len(failed)})
    dirs.append(run.dir)
    run.finish()
    return dirs


# -- entry points -------------------------------------------------------------------------------------------

def report(dirs: list[str | Path], out: str | Path | None = None, metric: str | None = None,
           use_wandb: bool = False, wandb_project: str = "mhalab", plots: bool = True,
           baseline: str | None = None) -> dict[str, Any]:
    """Write report.md, report.csv and the plots; returns {"rows", "failed", "swept", "out", "plots", "markdown"}."""
    dirs = [Path(d) for d in dirs]
    if not dirs:
        raise ConfigError("give at least one multirun directory")
    out = Path(out) if out else dirs[0] / "report"
    runs, failed = find_runs(dirs)
    rows, swept = aggregate(runs, metric)
    add_paired(rows, baseline)
    out.mkdir(parents=True, exist_ok=True)
    plot_paths = make_plots(rows, out) if plots else []
    write_csv(rows, out / "report.csv")
    md = markdown(rows, failed, dirs, plot_paths, out)
    (out / "report.md").write_text(md)
    (out / "failed.json").write_text(json.dumps(failed, indent=2))
    result = {"rows": rows, "failed": failed, "swept": swept, "out": out, "plots": plot_paths, "markdown": md}
    if use_wandb:
        result["wandb_dirs"] = log_wandb(rows, failed, group=dirs[0].resolve().name, project=wandb_project, out=out)
    return result


def run_cli(args) -> int:
    r = report(args.dirs, args.out, args.metric, args.wandb, args.wandb_project, plots=not args.no_plots,
               baseline=args.baseline)
    print(r["markdown"])
    print(f"wrote {r['out'] / 'report.md'}, {r['out'] / 'report.csv'} and {len(r['plots'])} plot(s)")
    return 0


def main(argv: list[str] | None = None) -> None:
    from mhalab.cli import run_command

    code = run_command("report", sys.argv[1:] if argv is None else argv)
    if code:
        sys.exit(code)


if __name__ == "__main__":
    main()
