"""Sweep reports: `python -m mhalab.report <multirun_dir>... [--out DIR] [--metric KEY] [--wandb]`.

Reads every `summary.json` under the given directories (written by `mhalab.train`; no tracker needed), groups the
jobs into configurations (a job's overrides minus `seed`), and writes into `--out` (default `<first_dir>/report`):

- `report.md`: one row per configuration, sorted by n_heads, then n_kv_heads (MHA to MQA), then d_head, with
  parameters, forward FLOPs/token, KV-cache bytes/token, training tokens/s, the final validation metric as
  mean ± std over seeds (sample std, ddof=1), the test metric of the best checkpoint, and per-head statistic
  summaries (mean normalised attention entropy, confidence, attention distance, previous-token weight, the
  spread of head importance, and the within-KV-group similarity); then a "Failed jobs" section with each error;
- a paired comparison: each configuration's metric minus a baseline's (`--baseline`, default the first row) for
  the same seed, mean ± std over seeds; it separates configurations even when the seed spread is large;
- `report.csv`: the same rows, numbers unformatted (`<metric>_mean`, `<metric>_std`, ...);
- PNG plots: metric vs n_heads; metric vs n_kv_heads beside KV-cache bytes/token and tokens/s; metric vs d_head
  (each when that key varies), or a bar chart per configuration otherwise.

The metric is `val/acc` (higher is better) for classification and `val/bpb` (bits per byte, lower is better) for
language modelling, chosen per run from its objective unless `--metric` names a key of summary["metrics"].
A job directory of a multirun without summary.json (killed, or still running) is listed as failed too.
`--wandb` also logs one offline wandb run per configuration, all in one wandb group, plus a table run.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from mhalab.errors import ConfigError
from mhalab.plots import new_figure

LM_METRIC, CLS_METRIC = "val/bpb", "val/acc"
LOWER_IS_BETTER = {"val/bpb", "val/loss", "test/bpb", "test/loss"}
# per-head statistics summarised in the table (mean over layers x heads, then mean over seeds)
HEAD_STATS = ("entropy_norm", "confidence", "distance", "prev")


# -- reading ------------------------------------------------------------------------------------------------

def find_jobs(dirs: list[Path]) -> list[dict[str, Any]]:
    """Every job under `dirs`: {"dir", "summary" (dict or None)}; a multirun job dir without summary.json has None."""
    jobs: dict[Path, dict | None] = {}
    for d in dirs:
        d = Path(d)
        if not d.exists():
            raise ConfigError(f"{d} does not exist (give a multirun directory, e.g. logs/head_sweep/multiruns/<id>)")
        for p in sorted(d.rglob("summary.json")):
            if "report" in p.relative_to(d).parts[:-1]:
                continue
            try:
                jobs[p.parent.resolve()] = json.loads(p.read_text())
            except (OSError, json.JSONDecodeError) as e:
                jobs[p.parent.resolve()] = {"status": "failed", "error": f"unreadable summary.json ({e})",
                                            "overrides": _hydra_overrides(p.parent)}
        # Hydra job folders (with .hydra/) that never wrote a summary
        for hydra_dir in sorted(d.rglob(".hydra")):
            job = hydra_dir.parent.resolve()
            if job not in jobs and (hydra_dir / "overrides.yaml").is_file() and job != d.resolve():
                jobs[job] = None
    if not jobs:
        raise ConfigError(f"no summary.json under {', '.join(map(str, dirs))}: run a sweep first "
                          "(python -m mhalab.train -m experiment=head_sweep)")
    return [{"dir": k, "summary": v} for k, v in sorted(jobs.items(), key=lambda kv: _job_order(kv[0]))]


def _job_order(path: Path) -> tuple:
    return (str(path.parent), int(path.name) if path.name.isdigit() else 10**9, path.name)


def _hydra_overrides(job_dir: Path) -> list[str]:
    f = Path(job_dir) / ".hydra" / "overrides.yaml"
    if not f.is_file():
        return []
    from omegaconf import OmegaConf

    try:
        return [str(x) for x in OmegaConf.load(f)]
    except Exception:  # noqa: BLE001 - a broken file only loses the label
        return []


def config_key(overrides: list[str]) -> tuple[str, ...]:
    """The configuration a job belongs to: its overrides without seed (and without hydra.* bookkeeping)."""
    keep = []
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if key in ("seed",) or key.startswith("hydra.") or key.startswith("hydra/"):
            continue
        keep.append(o)
    return tuple(sorted(keep))


def _attn(cfg: dict) -> dict[str, Any]:
    a, m = cfg.get("attention") or {}, cfg.get("model") or {}
    n_heads = a.get("n_heads")
    d_model = m.get("d_model")
    d_head = a.get("d_head") or (d_model // n_heads if d_model and n_heads else None)
    return {"n_heads": n_heads, "n_kv_heads": a.get("n_kv_heads") or n_heads, "d_head": d_head, "d_model": d_model,
            "n_layers": m.get("n_layers")}


def default_metric(summary: dict) -> str:
    return CLS_METRIC if summary.get("objective", "classification") == "classification" else LM_METRIC


# -- aggregation --------------------------------------------------------------------------------------------

def mean_std(values: list[float]) -> tuple[float | None, float | None]:
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not vals:
        return None, None
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else None)


def _head_stat_mean(summary: dict, stat: str) -> float | None:
    vals = [h[stat] for h in (summary.get("head_stats") or {}).values() if h.get(stat) is not None]
    return statistics.fmean(vals) if vals else None


def _importance_cv(summary: dict) -> float | None:
    """Coefficient of variation of head importance over all heads: 0 = all heads equally important."""
    vals = [v for v in (summary.get("head_importance") or {}).values() if v is not None]
    if len(vals) < 2 or statistics.fmean(vals) == 0:
        return None
    return statistics.pstdev(vals) / statistics.fmean(vals)


def _within_group_jsd(summary: dict) -> float | None:
    vals = [g.get("within_group_jsd") for g in (summary.get("kv_groups") or {}).values()]
    vals = [v for v in vals if v is not None]
    return statistics.fmean(vals) if vals else None


def aggregate(jobs: list[dict], metric: str | None = None) -> tuple[list[dict], list[dict], list[str]]:
    """(rows, failed, swept keys). One row per configuration of successful jobs."""
    ok, failed = [], []
    for job in jobs:
        s = job["summary"]
        if s is None:
            failed.append({"dir": str(job["dir"]), "overrides": _hydra_overrides(job["dir"]), "kind": "missing",
                           "error": "no summary.json (the job was killed or is still running)"})
        elif s.get("status") != "ok":
            failed.append({"dir": str(job["dir"]), "overrides": s.get("overrides") or _hydra_overrides(job["dir"]),
                           "kind": s.get("kind", "error"), "error": s.get("error", "unknown error")})
        else:
            ok.append((job, s))
    groups: dict[tuple, list[tuple[dict, dict]]] = {}
    for job, s in ok:
        groups.setdefault(config_key(s.get("overrides") or []), []).append((job, s))

    # keys that differ between configurations (the swept ones), in first-seen order
    all_keys = [dict(o.split("=", 1) for o in k if "=" in o) for k in groups]
    swept: list[str] = []
    for d in all_keys:
        for key in d:
            if key not in swept and len({dd.get(key) for dd in all_keys}) > 1:
                swept.append(key)

    rows = []
    for key, members in groups.items():
        first = members[0][1]
        cfg = first.get("config") or {}
        kv = dict(o.split("=", 1) for o in key if "=" in o)
        label = ", ".join(f"{k}={kv[k]}" for k in swept if k in kv) or (", ".join(key) or "default")
        m = metric or default_metric(first)
        test_m = m.replace("val/", "test/") if m.startswith("val/") else None
        row: dict[str, Any] = {"config": label, "task": first.get("task"), **_attn(cfg),
                               "seeds": " ".join(str((s.get("config") or {}).get("seed")) for _, s in members),
                               "n_seeds": len(members), "metric": m,
                               "params": first.get("cost", {}).get("params"),
                               "flops_per_token": first.get("cost", {}).get("flops_per_token"),
                               "attention_flops_per_token": first.get("cost", {}).get("attention_flops_per_token"),
                               "kv_cache_bytes_per_token": first.get("cost", {}).get("kv_cache_bytes_per_token")}
        row["metric_mean"], row["metric_std"] = mean_std([s.get("metrics", {}).get(m) for _, s in members])
        row["per_seed"] = {(s.get("config") or {}).get("seed"): s.get("metrics", {}).get(m) for _, s in members}
        row["test_metric"] = test_m
        row["test_mean"], row["test_std"] = mean_std([s.get("test_metrics", {}).get(test_m) for _, s in members]) \
            if test_m else (None, None)
        row["tokens_per_s_mean"], row["tokens_per_s_std"] = mean_std(
            [s.get("timings", {}).get("tokens_per_s") for _, s in members])
        row["fit_s_mean"], _ = mean_std([s.get("timings", {}).get("fit_s") for _, s in members])
        row["train_steps"] = first.get("timings", {}).get("train_steps")
        for stat in HEAD_STATS:
            row[f"{stat}_mean"], _ = mean_std([_head_stat_mean(s, stat) for _, s in members])
        row["importance_cv_mean"], _ = mean_std([_importance_cv(s) for _, s in members])
        row["within_group_jsd_mean"], _ = mean_std([_within_group_jsd(s) for _, s in members])
        row["run_dirs"] = [str(j["dir"]) for j, _ in members]
        rows.append(row)

    def order(r: dict) -> tuple:
        return (r["n_heads"] or 0, -(r["n_kv_heads"] or 0), r["d_head"] or 0, r["config"])

    rows.sort(key=order)
    return rows, failed, swept


def add_paired_deltas(rows: list[dict], baseline: str | None = None) -> dict | None:
    """Metric minus the baseline configuration's, paired by seed (same seed = same data order and init stream):
    `delta_mean`, `delta_std` (sample std over the common seeds), `delta_n`. Paired differences cancel the
    seed-to-seed variation that both configurations share. Baseline: the row whose label is `baseline`, else the
    first row. Returns the baseline row (None without rows)."""
    if not rows:
        return None
    base = next((r for r in rows if baseline is not None and r["config"] == baseline), None)
    if baseline is not None and base is None:
        raise ConfigError(f"--baseline {baseline!r} is not a configuration of this sweep: one of "
                          f"{', '.join(r['config'] for r in rows)}")
    base = base or rows[0]
    for r in rows:
        common = [s for s in r["per_seed"] if s in base["per_seed"] and r["per_seed"][s] is not None
                  and base["per_seed"][s] is not None and r["metric"] == base["metric"]]
        diffs = [r["per_seed"][s] - base["per_seed"][s] for s in common]
        r["delta_mean"], r["delta_std"] = mean_std(diffs)
        r["delta_n"] = len(diffs)
        r["baseline"] = base["config"]
    return base


# -- writing ------------------------------------------------------------------------------------------------

CSV_COLUMNS = ["config", "task", "n_heads", "n_kv_heads", "d_head", "d_model", "n_layers", "n_seeds", "seeds",
               "params", "flops_per_token", "attention_flops_per_token", "kv_cache_bytes_per_token",
               "tokens_per_s_mean", "tokens_per_s_std", "metric", "metric_mean", "metric_std", "test_metric",
               "test_mean", "test_std", "baseline", "delta_n", "delta_mean", "delta_std", "train_steps",
               "fit_s_mean"] + [f"{s}_mean" for s in HEAD_STATS] + \
              ["importance_cv_mean", "within_group_jsd_mean"]


def _fmt(x: Any, digits: int = 4) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 1e5 else f"{x:.3g}"
    if isinstance(x, int) and abs(x) >= 10000:
        return f"{x:,}"
    return str(x)


def pm(mean: float | None, std: float | None, digits: int = 4) -> str:
    """'mean ± std' (std over seeds); 'mean (n=1)' when there is one seed only."""
    if mean is None:
        return "-"
    if std is None:
        return f"{mean:.{digits}f} (1 seed)"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def write_csv(rows: list[dict], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_COLUMNS})


def markdown(rows: list[dict], failed: list[dict], dirs: list[Path], plots: list[Path], out: Path) -> str:
    metrics = sorted({r["metric"] for r in rows})
    lines = ["# Sweep report", "", f"Source: {', '.join(str(d) for d in dirs)}", ""]
    if rows:
        desc = "; ".join(f"`{m}` ({'lower' if m in LOWER_IS_BETTER else 'higher'} is better)" for m in metrics)
        lines += [f"Metric: {desc}, the final validation value, mean ± sample std over seeds; test: the best "
                  "checkpoint on the test split. Δ vs baseline: this configuration's metric minus the baseline's "
                  f"(`{rows[0].get('baseline')}`) for the same seed, mean ± std over the seeds both have: it "
                  "removes the seed-to-seed variation the configurations share. "
                  "Head statistics are means over all layers and heads "
                  "(entropy_norm: attention entropy / log(keys); confidence: max weight; distance: mean |i - j|; "
                  "prev: weight on the previous token); importance CV: std / mean of head importance "
                  "(Michel et al. 2019); within-group JSD: divergence between query heads sharing a KV head.", ""]
        header = ["config", "heads", "kv heads", "d_head", "seeds", "params", "FLOPs/token", "KV bytes/token",
                  "tokens/s", "val metric", "Δ vs baseline (paired)", "test metric", "entropy_norm", "confidence",
                  "distance", "prev",
                  "importance CV", "within-group JSD"]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for r in rows:
            cells = [r["config"], _fmt(r["n_heads"]), _fmt(r["n_kv_heads"]), _fmt(r["d_head"]), _fmt(r["n_seeds"]),
                     _fmt(r["params"]), _fmt(r["flops_per_token"]), _fmt(r["kv_cache_bytes_per_token"]),
                     pm(r["tokens_per_s_mean"], r["tokens_per_s_std"], 0),
                     f"{r['metric']} {pm(r['metric_mean'], r['metric_std'])}",
                     "baseline" if r["config"] == r.get("baseline") else
                     (f"{r['delta_mean']:+.4f} ± {r['delta_std']:.4f}" if r.get("delta_std") is not None else
                      (f"{r['delta_mean']:+.4f} (1 seed)" if r.get("delta_mean") is not None else "-")),
                     pm(r["test_mean"], r["test_std"]),
                     _fmt(r["entropy_norm_mean"], 3), _fmt(r["confidence_mean"], 3), _fmt(r["distance_mean"], 3),
                     _fmt(r["prev_mean"], 3), _fmt(r["importance_cv_mean"], 3), _fmt(r["within_group_jsd_mean"], 3)]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    else:
        lines += ["No successful job.", ""]
    lines += [f"## Failed jobs ({len(failed)})", ""]
    if failed:
        lines += ["| job | overrides | kind | error |", "|---|---|---|---|"]
        for f in failed:
            err = str(f["error"]).replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {Path(f['dir']).name} | {' '.join(f['overrides'])} | {f['kind']} | {err} |")
    else:
        lines.append("None.")
    lines.append("")
    if plots:
        lines += ["## Plots", ""] + [f"![{p.stem}]({p.relative_to(out) if p.is_relative_to(out) else p})"
                                      for p in plots] + [""]
    return "\n".join(lines)


# -- plots --------------------------------------------------------------------------------------------------

def _errorbar(ax, rows: list[dict], x: str, y: str = "metric", log2: bool = True, label: str | None = None) -> None:
    pts = sorted((r[x], r[f"{y}_mean"], r.get(f"{y}_std") or 0.0) for r in rows
                 if r.get(x) is not None and r.get(f"{y}_mean") is not None)
    if not pts:
        return
    xs, ms, ss = zip(*pts)
    line = ax.errorbar(xs, ms, yerr=ss, marker="o", capsize=4, label=label)
    if y == "metric":  # each seed as a faint line: paired differences show where the error bars overlap
        with_x = sorted((r for r in rows if r.get(x) is not None and r.get("per_seed")), key=lambda r: r[x])
        seeds = sorted({s for r in with_x for s in r["per_seed"]}, key=str)
        for s in seeds:
            sp = [(r[x], r["per_seed"][s]) for r in with_x if r["per_seed"].get(s) is not None]
            if len(sp) > 1:
                ax.plot(*zip(*sp), linestyle=":", linewidth=1, alpha=0.5, color=line[0].get_color())
    if log2 and min(xs) > 0:
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([str(v) for v in xs])
    ax.set_xlabel(x)
    ax.grid(alpha=0.3)


def _series(rows: list[dict], x: str) -> list[tuple[str | None, list[dict]]]:
    """Rows split into lines: one per value of the other architecture keys, so each x appears once per line."""
    def varies_at_fixed_x(k: str) -> bool:  # keys that merely follow x (d_head = d_model / n_heads) do not split
        seen: dict = {}
        for r in rows:
            seen.setdefault(r.get(x), set()).add(r.get(k))
        return any(len(v) > 1 for v in seen.values())

    others = [k for k in ("n_heads", "n_kv_heads", "d_head", "task") if k != x and varies_at_fixed_x(k)]
    by: dict[tuple, list[dict]] = {}
    for r in rows:
        by.setdefault(tuple(r.get(k) for k in others), []).append(r)
    if len(by) == 1:
        return [(None, rows)]
    out = []
    for key, rs in by.items():
        label = ", ".join(f"{k}={v}" for k, v in zip(others, key) if len({rr.get(k) for rr in rows}) > 1)
        out.append((label, rs))
    return out


def _ylabel(rows: list[dict]) -> str:
    ms = sorted({r["metric"] for r in rows})
    return " / ".join(f"{m} ({'lower' if m in LOWER_IS_BETTER else 'higher'} is better)" for m in ms)


def make_plots(rows: list[dict], out: Path) -> list[Path]:
    
    paths: list[Path] = []
    ok = [r for r in rows if r.get("metric_mean") is not None]
    if not ok:
        return paths

    def varies(k: str) -> bool:
        """k takes several values; n_kv_heads and d_head only count when they vary at a fixed n_heads (in a head
        sweep they follow n_heads and get no plot of their own)."""
        if k == "n_heads":
            return len({r.get(k) for r in ok}) > 1
        by_heads: dict = {}
        for r in ok:
            by_heads.setdefault(r.get("n_heads"), set()).add(r.get(k))
        return any(len(v) > 1 for v in by_heads.values())

    def save(fig, name: str) -> None:
        fig.tight_layout()
        p = out / name
        fig.savefig(p, dpi=110)
        paths.append(p)

    title = ", ".join(sorted({str(r["task"]) for r in ok}))
    for key in ("n_heads", "d_head"):  # one panel each: metric against the swept size
        if not varies(key):
            continue
        fig = new_figure(figsize=(5.5, 4))
        ax = fig.add_subplot()
        for label, rs in _series(ok, key):
            _errorbar(ax, rs, key, label=label)
        ax.set_ylabel(_ylabel(ok))
        ax.set_title(f"{title}: metric vs {key} (mean ± std; dotted: each seed)", fontsize=9)
        if len(_series(ok, key)) > 1:
            ax.legend(fontsize=7)
        save(fig, f"metric_vs_{key}.png")
    if varies("n_kv_heads"):
        fig = new_figure(figsize=(13, 3.8))
        axes = fig.subplots(1, 3)
        for label, rs in _series(ok, "n_kv_heads"):
            _errorbar(axes[0], rs, "n_kv_heads", label=label)
            pts = sorted((r["n_kv_heads"], r["kv_cache_bytes_per_token"]) for r in rs
                         if r.get("kv_cache_bytes_per_token") is not None)
            if pts:
                axes[1].plot(*zip(*pts), marker="o", label=label)
            _errorbar(axes[2], rs, "n_kv_heads", y="tokens_per_s", label=label)
        axes[0].set_ylabel(_ylabel(ok))
        axes[0].set_title("val metric (mean ± std; dotted: each seed)", fontsize=9)
        axes[1].set_xscale("log", base=2)
        kvs = sorted({r["n_kv_heads"] for r in ok if r.get("n_kv_heads")})
        axes[1].set_xticks(kvs)
        axes[1].set_xticklabels([str(v) for v in kvs])
        axes[1].set_xlabel("n_kv_heads")
        axes[1].set_ylabel("KV-cache bytes / token")
        axes[1].set_title("KV cache (fp32, all layers)", fontsize=9)
        axes[1].grid(alpha=0.3)
        axes[2].set_ylabel("training tokens / s")
        axes[2].set_title("throughput (mean ± std)", fontsize=9)
        fig.suptitle(f"{title}: MHA -> GQA -> MQA", fontsize=10)
        save(fig, "metric_vs_n_kv_heads.png")
    if not paths:
        fig = new_figure(figsize=(max(6.0, 1.5 * len(ok)), 4.5))
        ax = fig.add_subplot()
        ax.bar(range(len(ok)), [r["metric_mean"] for r in ok], yerr=[r["metric_std"] or 0 for r in ok], capsize=4)
        ax.set_xticks(range(len(ok)))
        ax.set_xticklabels([r["config"] for r in ok], rotation=30, ha="right", fontsize=7)
        ax.set_ylabel(_ylabel(ok))
        save(fig, "metric_by_config.png")
    return paths


# -- wandb --------------------------------------------------------------------------------------------------

def log_wandb(rows: list[dict], failed: list[dict], group: str, project: str, out: Path) -> list[str]:
    """One offline wandb run per configuration (group=`group`), plus a `<group>-table` run with the whole table.

    Offline only: nothing waits for a network; sync later with `wandb sync <out>/wandb/offline-run-*`.
    Returns the run directories.
    """
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ["WANDB_MODE"] = "offline"
    import wandb

    dirs = []
    settings = wandb.Settings(silent=True, init_timeout=60, x_disable_stats=True)
    for r in rows:
        run = wandb.init(project=project, group=group, name=r["config"], job_type="report", dir=str(out),
                         mode="offline", settings=settings, reinit="finish_previous",
                         config={k: r.get(k) for k in ("task", "n_heads", "n_kv_heads", "d_head", "d_model",
                                                      "n_layers", "params", "flops_per_token",
                                                      "kv_cache_bytes_per_token", "seeds")})
        run.summary.update({k: r.get(k) for k in CSV_COLUMNS if isinstance(r.get(k), (int, float))})
        dirs.append(run.dir)
        run.finish()
    run = wandb.init(project=project, group=group, name=f"{group}-table", job_type="report-table", dir=str(out),
                     mode="offline", settings=settings, reinit="finish_previous")
    table = wandb.Table(columns=CSV_COLUMNS, data=[[r.get(k) if not isinstance(r.get(k), list) else str(r.get(k))
                                                    for k in CSV_COLUMNS] for r in rows])
    run.log({"report": table, "n_failed": len(failed)})
    dirs.append(run.dir)
    run.finish()
    return dirs


# -- entry point --------------------------------------------------------------------------------------------

def report(dirs: list[str | Path], out: str | Path | None = None, metric: str | None = None,
           use_wandb: bool = False, wandb_project: str = "mhalab", plots: bool = True,
           baseline: str | None = None) -> dict[str, Any]:
    """Write report.md, report.csv and plots; returns {"rows", "failed", "out", "plots", "markdown"}."""
    dirs = [Path(d) for d in dirs]
    if not dirs:
        raise ConfigError("give at least one multirun directory")
    out = Path(out) if out else dirs[0] / "report"
    jobs = find_jobs(dirs)
    rows, failed, swept = aggregate(jobs, metric)
    add_paired_deltas(rows, baseline)
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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m mhalab.report", description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="+", help="multirun directories (or any folders holding summary.json files)")
    p.add_argument("--out", help="output folder (default <first dir>/report)")
    p.add_argument("--metric", help="key of summary['metrics'] (default val/acc for classification, val/bpb for LM)")
    p.add_argument("--wandb", action="store_true", help="also log the runs to wandb (offline), grouped per sweep")
    p.add_argument("--wandb-project", default="mhalab")
    p.add_argument("--baseline", help="configuration label for the paired Δ column, e.g. 'attention.n_heads=8' "
                                      "(default: the first row)")
    p.add_argument("--no-plots", action="store_true")
    a = p.parse_args(argv)
    try:
        r = report(a.dirs, a.out, a.metric, a.wandb, a.wandb_project, plots=not a.no_plots, baseline=a.baseline)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(r["markdown"])
    print(f"wrote {r['out'] / 'report.md'}, {r['out'] / 'report.csv'} and {len(r['plots'])} plot(s)")


if __name__ == "__main__":
    main()
