"""Sweep reports: `mhalab report <multirun_dir>... [--baseline LABEL] [--metric KEY] [--out DIR] [--wandb]`.

Reads every run under the folders through the run contract (`mhalab.runs.summary.read_summary`), places each in its arm
and tuned cell (`report.runs`), picks each arm's best cell on validation and compares the arms with the baseline
on the endpoints the runs declared (`report.arms`), and writes into `--out` (default `<first dir>/report`):

- `report.md` and `report.html` (self-contained, pictures inline): the design as the runs recorded it, the tuning
  of every arm, the comparisons with their tests, intervals, p and Holm-adjusted p, the verdicts, the head
  statistics per arm and the failed jobs;
- `report.csv`: one row per arm and tuned cell, with one column per seed; `report.json`: the same for programs
  (`mhalab report --table` builds the README's experiments table from these files);
- `runs.csv`: one row per run (arm, cell, seed, stage): its val and test metrics, steps to the threshold and
  environment, so every p of the report can be recomputed from the published data;
- pictures (`report.figures`).
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

from mhalab import stats as inf
from mhalab.config.writes import check_links
from mhalab.errors import ConfigError
from mhalab.relative_path import relative
from mhalab.report import figures, numerics
from mhalab.report.options import ReportOptions
from mhalab.report.arms import HEAD_STATS, Arm, apply_holm, arms_of, compare, head_stats, median_text, pick_baseline
from mhalab.report.runs import COST, find_runs, place, seed_order, selection_seeds, the_metric, tuned_keys
from mhalab.runs.summary import ENV_COLUMNS, env_row, json_text
from mhalab.tables import Link, Table, fmt, fmt_p, interval, md_escape, write_csv

__all__ = ["report", "md_escape", "ReportOptions", "report_command"]


def report(dirs: list[str | Path], out: str | Path | None = None, metric: str | None = None,
           use_wandb: bool = False, wandb_project: str = "mhalab", plots: bool = True,
           baseline: str | None = None, same_arm: tuple[str, ...] = ()) -> dict[str, Any]:
    """Write the report (same_arm: override keys that do not make an arm, see report.runs.place); returns {"arms",
    "comparisons", "failed", "metric", "out", "plots", "markdown"}."""
    dirs = [Path(d) for d in dirs]
    if not dirs:
        raise ConfigError("give at least one multirun directory")
    found, failed = find_runs(dirs)
    arms: list[Arm] = []
    comparisons: list[dict] = []
    m = None
    if found:
        m = the_metric(found, metric)
        tuned = tuned_keys(found)
        selection_seeds(found)  # one declaration of the stages, or a ConfigError
        arms = arms_of(place(found, tuned, tuple(same_arm)), m)
        base = pick_baseline(arms, baseline)
        comparisons = [c for a in arms if a is not base for c in compare(a, base, m)]
        apply_holm(comparisons)
    if out is None:  # inside runs someone else may have made: no link may carry the report elsewhere
        out = dirs[0] / "report"
        check_links(out, dirs[0], "write the report there")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    pictures: list[Path] = []
    if plots and arms:
        levels = arms[0].chosen.runs[0].summary.baselines
        test_m = m.replace("val/", "test/", 1)
        shown = test_m if all(v is not None for a in arms for v in a.chosen.values(test_m)) else m
        pictures = [p for p in (figures.tuning(arms, m, out), figures.reached(arms, out), figures.curves(arms, m, out),
                                figures.final(arms, shown, out, levels), figures.heads(arms, out)) if p]
    records = cell_records(arms)
    write_csv(out / "report.csv", csv_columns(records), records)
    per_run = run_records(arms)
    write_csv(out / "runs.csv", run_columns(per_run), per_run)
    data = {"metric": m, "sources": [str(d) for d in dirs], "arms": [arm_record(a) for a in arms],
            "comparisons": [{k: v for k, v in c.items()} for c in comparisons], "failed": failed}
    (out / "report.json").write_text(json_text(data))
    sections = document(arms, comparisons, failed, m, dirs, baseline)
    md = markdown(sections, pictures, out)
    (out / "report.md").write_text(md)
    views = [r.dir / "plots" / "attention.html" for a in arms for r in a.chosen.runs]
    (out / "report.html").write_text(page(sections, pictures, [v for v in views if v.is_file()], out))
    (out / "failed.json").write_text(json_text(failed))
    result = {"arms": arms, "comparisons": comparisons, "failed": failed, "metric": m, "out": out,
              "plots": pictures, "markdown": md}
    if use_wandb:
        result["wandb_dirs"] = log_wandb(records, comparisons, group=dirs[0].resolve().name, project=wandb_project,
                                         out=out)
    return result


# -- content -------------------------------------------------------------------------------------------------------

def document(arms: list[Arm], comparisons: list[dict], failed: list[dict], metric: str | None, dirs: list[Path],
             baseline: str | None) -> list[tuple[str, str | Table]]:
    """The report as (heading or paragraph, table) sections, rendered to Markdown and HTML alike."""
    out: list[tuple[str, str | Table]] = [("# Sweep report", ""), ("", "Source: " + ", ".join(map(str, dirs)))]
    if not arms:
        return out + [("", "No successful run.")] + failed_section(failed)
    first = arms[0].chosen.runs[0]
    end = first.endpoint
    tuned = sorted({k.split("=", 1)[0] for a in arms for c in a.cells for k in c})
    out.append(("", f"Task `{first.summary.task}`. Metric `{metric}` "
                    f"({'lower' if inf.lower_is_better(metric) else 'higher'} is better)."
                    + (f" Endpoint threshold: {metric} {'<=' if inf.lower_is_better(metric) else '>='} "
                       f"{end['threshold']:g}, first reached at a validation during training"
                       + (" (runs stop there)" if end.get("stop_at_threshold") else "") + "."
                       if end.get("threshold") is not None else "")
                    + (f" Tuned per arm: {', '.join(tuned)} (each arm at its best value on validation: most runs "
                       "reaching the threshold, then fewest steps, then the best mean)." if tuned else "")
                    + (" " + stages_text(arms, bool(tuned))).rstrip()))
    out.append(("## Design (read from the runs)", design_table(arms)))
    if tuned or any(a.chosen.rate() for a in arms):
        out.append(("## Each arm at each tuned value (validation)", tuning_table(arms)))
    if comparisons:
        base = comparisons[0]["baseline"]
        out.append(("## Comparisons with the baseline",
                    f"Each arm at its chosen cell against `{base}`. Holm's correction over all {len(comparisons)} "
                    "p-values of this report; separated = Holm-adjusted p < 0.05. Each interval is its test "
                    "inverted (95%, before Holm's correction), so it excludes 0 exactly when that test's p < 0.05. "
                    "Rates count runs on validation; the final metric is the tested checkpoint on the test split. "
                    "Every run's values are in runs.csv."))
        out.append(("", comparison_table(comparisons)))
    stats = head_table(arms)
    if stats is not None:
        out.append(("## Head statistics per arm", "At the end of training, on the probe batch: each run's mean over "
                                                  "layers and heads; mean and 95% t interval over the arm's runs."))
        out.append(("", stats))
    levels = first.summary.baselines
    if levels:
        out.append(("", "Reference levels of the task: " + ", ".join(f"{k} {v:.4f}" for k, v in levels.items()
                                                                    if v is not None) + "."))
    return out + failed_section(failed)


def failed_section(failed: list[dict]) -> list[tuple[str, str | Table]]:
    if not failed:
        return [("## Failed jobs (0)", "None.")]
    t = Table(["job", "overrides", "kind", "error"])
    for f in failed:
        t.add([Path(f["dir"]).name, " ".join(f["overrides"]), f["kind"], f["error"]])
    return [(f"## Failed jobs ({len(failed)})", t)]


def design_table(arms: list[Arm]) -> Table:
    t = Table(["arm", "heads x d_head", "kv heads", "d_ff", "params", "FLOPs/token", "KV bytes/token", "batch",
               "max steps", "val every", "passes", "tuned values", "seeds", "runs"])
    for a in arms:
        d = a.design
        runs = [r for c in a.cells.values() for r in c.runs]
        seeds = sorted({r.seed for r in runs}, key=seed_order)
        batches = {r.summary.config.get("data", {}).get("batch_size") for r in runs}
        t.add([a.label, f"{d['n_heads']} x {d['d_head']}", fmt(d["n_kv_heads"]), fmt(d["d_ff"]), fmt(d["params"]),
               fmt(d["flops_per_token"]), fmt(d["kv_cache_bytes_per_token"]),
               " ".join(map(str, sorted(batches, key=str))), fmt(d["max_steps"]), fmt(d["val_every"]),
               fmt(d["passes"], 3), "; ".join(c.label for c in sorted(a.cells.values(), key=lambda c: c.label)),
               _seed_range(seeds), len(runs)])
    return t


def _seed_range(seeds: list) -> str:
    if seeds and all(isinstance(s, int) for s in seeds) and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else str(seeds[0])
    return " ".join(map(str, seeds))


def tuning_table(arms: list[Arm]) -> Table:
    t = Table(["arm", "cell", "runs", "reached [95% CP]", "median steps to threshold [95%]",
               "final val: mean [95% t]", "chosen"])
    for a in arms:
        for full in sorted(a.cells.values(), key=lambda c: c.label):
            c = full.at_stage("A")  # what chose the value
            if not c.runs:
                continue
            rate = c.rate()
            reached = "-" if rate is None else f"{rate[0]}/{rate[1]} [{inf.rate(*rate)[1]:.2f}, " \
                                               f"{inf.rate(*rate)[2]:.2f}]"
            km = c.km()
            vals = [v for v in c.values() if v is not None]
            chosen = full is a.chosen
            t.add([a.label, c.label, len(c.runs), reached, "-" if km is None else median_text(km),
                   interval(*inf.mean_ci(vals)) if vals else "-", "yes" if chosen else ""],
                  bold=range(7) if chosen else ())
    return t


def comparison_table(comparisons: list[dict]) -> Table:
    t = Table(["arm", "endpoint", "arm value", "baseline value", "difference [95% CI]", "test", "p", "Holm p",
               "verdict"])
    for c in comparisons:
        diff = interval(c.get("estimate"), c.get("ci95_low"), c.get("ci95_high"), unbounded=c.get("p") is not None) \
            if c.get("estimate") is not None else "-"
        arm = c["arm"] if c["arm_cell"] == "-" else f"{c['arm']} ({c['arm_cell']})"  # a cell only where tuned
        t.add([arm, c["endpoint"], c["arm_value"], c["baseline_value"], diff, c["test"],
               fmt_p(c.get("p")), fmt_p(c.get("p_holm")), c["verdict"]],
              bold=(4, 8) if c["verdict"] == "separated" else ())
    return t


def head_table(arms: list[Arm]) -> Table | None:
    stats = {a.label: head_stats(a.chosen) for a in arms}
    names = [s for s in HEAD_STATS if any(s in v for v in stats.values())]
    if not names:
        return None
    t = Table(["arm", *names])
    for a in arms:
        t.add([a.label, *(interval(*stats[a.label][n]) if n in stats[a.label] else "-" for n in names)])
    return t


# -- records -------------------------------------------------------------------------------------------------------

def cell_records(arms: list[Arm]) -> list[dict]:
    """One record per arm and cell: design, rate, median steps, mean metric, and each seed's value."""
    out = []
    for a in arms:
        for c in a.cells.values():
            vals = [v for v in c.values() if v is not None]
            mean, lo, hi = inf.mean_ci(vals) if vals else (None, None, None)
            rate, km = c.rate(), c.km()
            out.append({"arm": a.label, "cell": c.label, "chosen": c is a.chosen, **a.design, "metric": c.metric,
                        "n": len(c.runs), "mean": mean, "mean_ci95_low": lo, "mean_ci95_high": hi,
                        "reached": None if rate is None else rate[0], "median_steps": None if km is None else km["median"],
                        **{f"seed_{s}": v for s, v in zip(c.seeds, c.values())}})
    return out


def run_records(arms: list[Arm]) -> list[dict]:
    """One record per run: where it sits (arm, cell, seed, stage, in a verdict), every val and test metric, its
    steps to the threshold and the environment it ran in."""
    out = []
    for a in arms:
        chosen = a.chosen
        for c in a.cells.values():
            for r in c.runs:
                s = r.summary
                out.append({"arm": a.label, "cell": c.label, "seed": r.seed, "stage": r.stage,
                            "chosen_cell": c is chosen, "in_verdicts": c is chosen and r.stage != "A",
                            "reached": r.reached(), "threshold_step": r.endpoint.get("threshold_step"),
                            "steps": r.steps(), "train_steps": s.timings.get("train_steps"),
                            **s.metrics, **s.test_metrics, **env_row(s.environment),
                            "dir": f"{r.dir.parent.name}/{r.dir.name}"})  # multirun folder / job
    return out


def run_columns(records: list[dict]) -> list[str]:
    metrics = sorted({k for r in records for k in r if "/" in k})
    return ["arm", "cell", "seed", "stage", "chosen_cell", "in_verdicts", "reached", "threshold_step", "steps",
            "train_steps", *metrics, *ENV_COLUMNS, "dir"]


def stages_text(arms: list[Arm], tuned: bool) -> str:
    """How the seeds were used: stage A chooses, stage B tests; or, undeclared, the same seeds did both."""
    runs = [r for a in arms for c in a.cells.values() for r in c.runs]
    if any(r.stage != "A+B" for r in runs):
        a_seeds = sorted({r.seed for r in runs if r.stage == "A"}, key=seed_order)
        b_seeds = sorted({r.seed for r in runs if r.stage == "B"}, key=seed_order)
        tested = (f"which use only the fresh seeds {_seed_range(b_seeds)} (stage B)" if b_seeds
                  else "which use only fresh (stage B) seeds: none has run yet, so nothing is tested")
        chose = (f"seeds {_seed_range(a_seeds)} (stage A) chose each arm's value" if a_seeds
                 else "each arm's value was chosen on stage-A seeds not among these runs")
        return f"Stages: {chose}, frozen before the comparisons, {tested}."
    if tuned:
        return ("Selection re-used: each arm's value was chosen on the same seeds its comparisons use, which favours "
                "the chosen values; declare endpoint.selection_seeds and run fresh seeds to test the choice.")
    return ""


def csv_columns(records: list[dict]) -> list[str]:
    seeds = sorted({k[5:] for r in records for k in r if k.startswith("seed_")},
                   key=lambda s: seed_order(int(s) if s.lstrip("-").isdigit() else s))
    base = ["arm", "cell", "chosen", "n_heads", "n_kv_heads", "d_head", "d_model", "d_ff", "n_layers", "batch_size",
            "max_steps", "passes", *COST, "metric", "n", "mean", "mean_ci95_low", "mean_ci95_high", "reached",
            "median_steps"]
    return base + [f"seed_{s}" for s in seeds]


def arm_record(a: Arm) -> dict:
    return {"label": a.label, "chosen": a.chosen.label, "design": a.design,
            "cells": {c.label: {"seeds": c.seeds, "values": c.values(), "rate": c.rate()} for c in a.cells.values()}}


# -- rendering -----------------------------------------------------------------------------------------------------

def markdown(sections, pictures: list[Path], out: Path) -> str:
    lines = []
    for head, body in sections:
        if head:
            lines += [head, ""]
        if isinstance(body, Table):
            lines += [body.markdown(), ""]
        elif body:
            lines += [md_escape_text(body), ""]
    if pictures:
        lines += ["## Pictures", ""] + [f"![{p.stem}]({p.relative_to(out) if p.is_relative_to(out) else p})"
                                         for p in pictures] + [""]
    return "\n".join(lines)


def md_escape_text(text: str) -> str:
    """A paragraph of report prose: its own backticks kept, HTML never let through."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


PAGE_STYLE = ("body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}"
              "table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px;"
              "text-align:left;vertical-align:top}th{background:#f2f2f2}img{max-width:100%;margin:1em 0}"
              "code{background:#f5f5f5;padding:0 3px}")


def page(sections, pictures: list[Path], views: list[Path] = (), out: Path | None = None) -> str:
    """One self-contained HTML page: the same sections, every picture inline, and links to the runs' interactive
    attention pages (`views`, relative to `out` where the report is written)."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>mhalab report</title>"
             f"<style>{PAGE_STYLE}</style></head><body>"]
    for head, body in sections:
        if head:
            level = len(head) - len(head.lstrip("#"))
            parts.append(f"<h{level}>{html.escape(head.lstrip('# '))}</h{level}>")
        if isinstance(body, Table):
            parts.append(body.html())
        elif body:
            parts.append(f"<p>{_code(html.escape(body))}</p>")
    for p in pictures:
        data = base64.b64encode(p.read_bytes()).decode()
        parts.append(f"<h3>{html.escape(p.stem)}</h3><img alt='{html.escape(p.stem)}' src='data:image/png;base64,{data}'>")
    if views:
        parts.append("<h3>every head, interactive (hover a token)</h3><ul>")
        for v in views:
            href = relative(v, out) if out is not None else Path(v).as_posix()
            parts.append(f"<li><a href='{html.escape(href)}'>{html.escape(v.parent.parent.name)}</a></li>")
        parts.append("</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _code(escaped: str) -> str:
    """`text` in escaped prose as <code>."""
    pieces = escaped.split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(pieces))


# -- the README's experiments table ---------------------------------------------------------------------------------

def experiments_table(files: list[Path], base: Path = Path(".")) -> str:
    """The README's experiments table from experiments/*/results/report.json: one row per comparison, each
    experiment linked from `base` (the folder the table is read from)."""
    t = Table(["experiment", "arm vs baseline", "endpoint", "arm", "baseline", "difference [95% CI]", "test",
               "Holm p", "verdict"])
    for f in files:
        data = json.loads(Path(f).read_text())
        folder = Path(f).resolve().parent.parent
        for c in data["comparisons"]:
            diff = interval(c.get("estimate"), c.get("ci95_low"), c.get("ci95_high"),
                            unbounded=c.get("p") is not None) if c.get("estimate") is not None else "-"
            if c["test"].startswith("Fisher"):  # reports before issue 27: Newcombe's interval, not the test's
                diff += " Newcombe, not from the test"
            t.add([Link(folder.name, folder, base), f"{c['arm']} vs {c['baseline']}", c["endpoint"],
                   c["arm_value"], c["baseline_value"], diff, c["test"].split(";")[0], fmt_p(c.get("p_holm")),
                   c["verdict"]], bold=(8,) if c["verdict"] == "separated" else ())
    return t.markdown()


# -- wandb ---------------------------------------------------------------------------------------------------------

def log_wandb(records: list[dict], comparisons: list[dict], group: str, project: str, out: Path) -> list[str]:
    """One offline wandb run per arm and cell (group=`group`) and a `<group>-table` run with the comparisons."""
    import wandb

    settings = wandb.Settings(quiet=True, x_disable_stats=True)
    dirs = []
    for r in records:
        run = wandb.init(project=project, group=group, name=f"{r['arm']} | {r['cell']}", job_type="report",
                         dir=str(out), mode="offline", settings=settings, reinit="finish_previous",
                         config={k: v for k, v in r.items() if not k.startswith("seed_")})
        run.summary.update({k: v for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
        dirs.append(run.dir)
        run.finish()
    cols = ["arm", "baseline", "endpoint", "estimate", "ci95_low", "ci95_high", "test", "p", "p_holm", "verdict"]
    run = wandb.init(project=project, group=group, name=f"{group}-table", job_type="report-table", dir=str(out),
                     mode="offline", settings=settings, reinit="finish_previous")
    run.log({"comparisons": wandb.Table(columns=cols, data=[[c.get(k) for k in cols] for c in comparisons])})
    dirs.append(run.dir)
    run.finish()
    return dirs


# -- entry points --------------------------------------------------------------------------------------------------

def report_command(o: ReportOptions) -> int:
    """`mhalab report`: `report` on the options, its Markdown printed (or, with --table, the experiments table of
    report.json files or the verdicts table of stability.json files)."""
    if o.table:
        stability = [Path(f).name == "stability.json" for f in o.dirs]
        if any(stability) and not all(stability):
            raise ConfigError("--table: give report.json files (the experiments table) or stability.json files (the "
                              "verdicts table), not both")
        print(numerics.verdicts_table(o.dirs) if any(stability) else experiments_table(o.dirs))
        return 0
    if o.numerics:
        given = [f"--{k.replace('_', '-')}" for k in ("same_arm", "metric", "baseline") if getattr(o, k)]
        if given:
            raise ConfigError(f"--numerics compares finished reports: {', '.join(given)} belong to the command that "
                              "made each report, not to --numerics")
        result = numerics.stability(o.dirs)
        out = Path(o.out) if o.out is not None else numerics.named(o.dirs[0])[1].parent.parent  # beside the reports
        print(numerics.markdown(result))
        print(f"wrote {numerics.write(result, out)}, stability.csv and stability.json")
        return 0
    r = report(o.dirs, o.out, o.metric, o.wandb, o.wandb_project, plots=o.plots, baseline=o.baseline,
               same_arm=tuple(o.same_arm))
    print(r["markdown"])
    print(f"wrote {r['out'] / 'report.md'}, report.html, report.csv, runs.csv, report.json and {len(r['plots'])} "
          "picture(s)")
    return 0
