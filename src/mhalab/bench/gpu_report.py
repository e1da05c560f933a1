"""The report of `mhalab bench gpu`: Markdown for experiments/gpu/README.md, and the claims against the figures.

The goals and claims checked: >= 45% MFU in bf16 at d_model 1024 on an H100, >= 1.0x torch.nn.TransformerEncoder,
the statistics pass < 2% of training time, fused-kernel attention memory ~ n^1 and the math backend's ~ n^2, and MQA
decoding about 12x faster than MHA where decoding is memory-bound (Shazeer 2019). A goal missed says by how much.
A dry run measures no GPU: its report says so at the top and gives no verdict.
"""

from __future__ import annotations

import math
from pathlib import Path

from mhalab.bench.output import BASELINE, md_table

DRY_RUN_BANNER = ("**CPU DRY RUN: tiny shapes, no GPU figures.** This report only shows that `mhalab bench gpu` runs "
                  "end to end and writes its folder. Every number below comes from the CPU on toy sizes and says "
                  "nothing about any GPU; no claim is judged.")
MFU_GOAL, RATIO_GOAL, STATS_GOAL, SHAZEER = 0.45, 1.0, 0.02, 12.0


def _throughput_rows(result: dict) -> list[dict]:
    """One row per (run, model) of the throughput step."""
    rows = []
    for label, run in ((result["steps"].get("throughput") or {}).get("runs") or {}).items():
        for r in run.get("rows", []):
            rows.append({"run": label, "d_model": run["d_model"], "compile": "compiled" if run["compile"] else "eager",
                         "batch": run["batch"],
                         "seq_len": run["seq_len"], "n_layers": run["n_layers"], **r})
    return rows


def _fit(result: dict, backend: str, metric: str) -> dict | None:
    for f in (result["steps"].get("complexity") or {}).get("fits") or []:
        if f["backend"] == backend and f["metric"] == metric:
            return f["fit"] or f["fit_all"]
    return None


def claim_rows(result: dict) -> list[dict]:
    """[{claim, measured, verdict}]; the verdict says by how much a goal is missed."""
    dry = result["dry_run"]
    rows = []

    def add(claim: str, measured: str, verdict: str) -> None:
        rows.append({"claim": claim, "measured": "not measured (CPU dry run)" if dry else measured,
                     "verdict": "-" if dry else verdict})

    tp = _throughput_rows(result)
    big = [r for r in tp if r["d_model"] == 1024 and r["model"] == "mhalab"]
    if big:
        best = max(big, key=lambda r: r["mfu"])
        torch_mfu = max((r["mfu"] for r in tp if r["d_model"] == 1024 and r["model"] == BASELINE), default=math.nan)
        device = result["device_name"]
        where = "" if "H100" in device else f" (the goal is stated for an H100; this is {device})"
        add(f"MFU >= {MFU_GOAL:.0%} in bf16 at d_model 1024 on an H100",
            ", ".join(f"{r['run']}: {r['mfu']:.1%}" for r in big) + f" (torch's encoder at best {torch_mfu:.1%})",
            ("met" if best["mfu"] >= MFU_GOAL else f"missed by {100 * (MFU_GOAL - best['mfu']):.1f} points "
             f"(best {best['mfu']:.1%}, {best['run']})") + where)
    else:
        add(f"MFU >= {MFU_GOAL:.0%} in bf16 at d_model 1024", "no d_model 1024 run", "not measured")
    with_stats = [r for r in tp if r["model"] == "mhalab+stats"]
    if with_stats:
        worst = min(with_stats, key=lambda r: r["ratio_vs_baseline"])
        add(f">= {RATIO_GOAL:.1f}x {BASELINE} (training tokens/s, statistics included)",
            ", ".join(f"{r['run']}: {r['ratio_vs_baseline']:.3f}x" for r in with_stats),
            "met" if worst["ratio_vs_baseline"] >= RATIO_GOAL else
            f"missed by {100 * (RATIO_GOAL - worst['ratio_vs_baseline']):.1f}% at {worst['run']}")
    stats = [(label, s) for label, run in ((result["steps"].get("throughput") or {}).get("runs") or {}).items()
             for s in run.get("stats", [])]
    if stats:
        label, worst = max(stats, key=lambda x: x[1]["stats_fraction"])
        add(f"statistics pass < {STATS_GOAL:.0%} of training time",
            ", ".join(f"{lb}: {s['stats_fraction']:.2%} ({s['stats_pass_ms']:.0f} ms every {s['every_n_steps']} "
                      "steps)" for lb, s in stats),
            "met" if worst["stats_fraction"] < STATS_GOAL else
            f"missed by {100 * (worst['stats_fraction'] - STATS_GOAL):.2f} points at {label}")
    for backend, goal, claim in (("sdpa", 1.0, "fused-kernel (sdpa) attention memory ~ n^1"),
                                 ("math", 2.0, "math-backend attention memory ~ n^2")):
        fit = _fit(result, backend, "mem_fwdbwd_mib")
        if fit is None:
            add(claim, "no memory fit", "not measured")
            continue
        lo, hi = fit["ci95"]
        ci = f" [{lo:.2f}, {hi:.2f}]" if math.isfinite(lo) else ""
        add(claim, f"exponent {fit['exponent']:.2f}{ci} over n in [{fit['x_min']:g}, {fit['x_max']:g}] "
                   f"({fit['points']} points, forward+backward peak)",
            "holds" if abs(fit["exponent"] - goal) <= 0.15 else f"off by {fit['exponent'] - goal:+.2f}")
    decode = [r for r in (result["steps"].get("decode") or {}).get("decode") or []
              if r["n_kv_heads"] == 1 and "speedup_vs_mha" in r]
    if decode:
        top = max(decode, key=lambda r: (r["batch"] * r["context"], r["speedup_vs_mha"]))
        best = max(decode, key=lambda r: r["speedup_vs_mha"])
        add(f"MQA decodes ~{SHAZEER:.0f}x faster than MHA when memory-bound (Shazeer 2019)",
            f"{top['speedup_vs_mha']:.1f}x at B={top['batch']} context={top['context']} ({top['backend']}); best "
            f"{best['speedup_vs_mha']:.1f}x at B={best['batch']} context={best['context']} ({best['backend']})",
            "reached (>= 10x)" if best["speedup_vs_mha"] >= 10 else
            f"below: {best['speedup_vs_mha']:.1f}x against ~{SHAZEER:.0f}x")
    return rows


def _step_line(name: str, step: dict | None) -> str:
    if step is None:
        return "not run (not in steps)"
    line = f"**{step.get('status', '?')}** in {step.get('wall_s', 0):.0f} s"
    if step.get("note"):
        line += f": {step['note']}"
    if step.get("error"):
        line += f": `{step['error']}` (traceback in summary.json)"
    return line


def gpu_report(result: dict) -> str:
    m, steps = result["machine"], result["steps"]
    cfg = result["config"]
    parts = [f"# GPU check: {result['device_name']}"]
    if result["dry_run"]:
        parts.append(DRY_RUN_BANNER)
    parts.append(
        f"- device: {result['device_name']}" + (f", {m['gpu_memory_gib']} GiB" if m.get("gpu_memory_gib") else "")
        + f"\n- torch {m['torch']}, Python {m['python']}, {m['cpu']} ({m['cpu_count']} CPUs)"
        + f"\n- command: `mhalab bench gpu out={cfg['out'] or result['out']}"
        + f"{' dry_run=true' if cfg['dry_run'] else ''}`"
        + f", wall time {result['wall_s']:.0f} s (budget {cfg['budget_s']:.0f} s)"
        + "\n- every case sized itself from the free device memory (free_fraction="
        + f"{cfg['free_fraction']}); what did not fit is listed under Skipped")
    parts.append("## SDPA kernel that training runs (forward+backward of the sdpa backend, torch's own choice)\n\n"
                 + md_table(result["sdpa_kernels"], [("attention", "attention", ""), ("d_head", "d_head", "d"),
                                                     ("padding", "padding", ""), ("kernel", "kernel", "")]))
    t = steps.get("tests")
    parts.append("## 1. Tests (`pytest -m gpu tests/bench/test_gpu.py`)\n\n" + _step_line("tests", t) + (
        f"; {t['passed']} passed, {t['failures']} failed, {t['errors']} errors, {t['skipped']} skipped "
        f"(log `{t['log']}`)" if t and "passed" in t else ""))
    tr = steps.get("train")
    lines = [_step_line("train", tr)]
    if tr and tr.get("runs"):
        rows = [{"task": k, "status": r["status"], "steps": (r.get("timings") or {}).get("train_steps"),
                 "metric": ", ".join(f"{k2} {v:.4g}" for k2, v in (r.get("metrics") or {}).items()
                                     if k2 in ("val/acc", "val/bpb", "val/loss")),
                 "tokens_per_s": (r.get("timings") or {}).get("tokens_per_s"), "summary": r.get("summary", ""),
                 "log": r["log"]} for k, r in tr["runs"].items()]
        lines.append(md_table(rows, [("task", "task", ""), ("status", "status", ""), ("steps", "steps", ""),
                                     ("metric", "validation", ""), ("tokens_per_s", "tokens/s", ".0f"),
                                     ("summary", "summary.json", ""), ("log", "log", "")]))
        lines.append("Commands: " + "; ".join(f"`{r['command']}`" for r in tr["runs"].values()))
    parts.append("## 2. Training end to end\n\n" + "\n\n".join(lines))
    tp = steps.get("throughput")
    lines = [_step_line("throughput", tp)]
    rows = _throughput_rows(result)
    if rows:
        lines.append(md_table(rows, [
            ("d_model", "d_model", "d"), ("compile", "compile", ""), ("batch", "batch", "d"),
            ("model", "model", ""), ("step_ms", "ms / step", ".1f"), ("tokens_per_s", "tokens/s", ".0f"),
            ("ratio_vs_baseline", "ratio vs torch", ".3f"), ("achieved_tflops", "TFLOP/s", ".4g"),
            ("mfu", "MFU", ".1%")]))
        runs = tp["runs"]
        lines.append("MFU is against the measured bf16 matmul peak: " + ", ".join(
            f"{k} {r['peak_tflops']:.4g} TFLOP/s" for k, r in runs.items() if "peak_tflops" in r)
            + ". Sizes: n_layers " + ", ".join(sorted({str(r['n_layers']) for r in runs.values() if 'n_layers' in r}))
            + ", seq_len " + ", ".join(sorted({str(r['seq_len']) for r in runs.values() if 'seq_len' in r}))
            + ", d_head " + ", ".join(sorted({str(r['d_head']) for r in runs.values() if 'd_head' in r}))
            + "; d_ff " + ", ".join(f"{r['d_ff']} at d_model {r['d_model']}" for r in runs.values() if "d_ff" in r)
            + "; each run's folder (`throughput/<run>/`) has its report.md and plot.")
        stats = [{"run": k, **s} for k, r in runs.items() for s in r.get("stats", [])]
        lines.append(md_table(stats, [("run", "run", ""), ("stats_pass_ms", "statistics pass ms", ".1f"),
                                      ("every_n_steps", "every n steps", "d"),
                                      ("stats_fraction", "share of training time", ".2%"),
                                      ("importance_s", "importance s (once)", ".2f")]))
        lines += [f"- {k}: {r['note']}" for k, r in runs.items() if r.get("status") == "skipped"]
    parts.append("## 3. Training throughput against torch.nn.TransformerEncoder (bf16)\n\n" + "\n\n".join(lines))
    cx = steps.get("complexity")
    lines = [_step_line("complexity", cx)]
    if cx and cx.get("fits"):
        fits = [f for f in cx["fits"] if f["metric"] in ("fwdbwd_ms", "mem_fwdbwd_mib", "flops_fwd_closed")]
        lines.append(md_table([{"backend": f["backend"], "metric": f["label"], "fit": _fmt_fit(f["fit"] or
                                f["fit_all"]), "local": ", ".join(f"{s:.2f}" for _, _, s in f["local"])}
                               for f in fits], [("backend", "backend", ""), ("metric", "metric", ""),
                                                ("fit", "exponent b (y ~ n^b)", ""), ("local", "local slopes", "")]))
        lines.append(" ".join(f"![{Path(p).stem}]({p})" for p in cx.get("plots", []))
                     + "\n\nTables: `complexity/report.md`.")
    parts.append("## 4. Complexity: one attention layer against n, and equal-cost heads\n\n" + "\n\n".join(lines))
    dc = steps.get("decode")
    lines = [_step_line("decode", dc)]
    if dc and dc.get("decode"):
        lines.append(md_table(dc["decode"], [
            ("backend", "backend", ""), ("batch", "B", "d"), ("context", "context", "d"),
            ("n_kv_heads", "kv heads", "d"), ("cache_mib", "cache MiB", ".1f"), ("latency_ms", "ms / token", ".3f"),
            ("speedup_vs_mha", "speed-up vs MHA", ".2f"), ("implied_gb_per_s", "bytes read / latency GB/s", ".0f"),
            ("cache_filled_by", "cache from", "")]))
        lines.append(" ".join(f"![{Path(p).stem}]({p})" for p in dc.get("plots", [])))
    parts.append("## 5. Decoding with a KV cache: MQA / GQA against MHA\n\n" + "\n\n".join(lines))
    skipped = [s for key in ("complexity", "decode") for s in (steps.get(key) or {}).get("skipped") or []]
    skipped += [f"{k}: {s['note']}" for k, s in steps.items() if s.get("status") == "skipped"]
    if skipped:
        parts.append("## Skipped\n\n" + "\n".join(f"- {s}" for s in skipped))
    parts.append("## Claims and goals\n\n" + md_table(result["claims"], [("claim", "claim / goal", ""),
                                                                          ("measured", "measured", ""),
                                                                          ("verdict", "verdict", "")]))
    if not result["dry_run"] and any(r["verdict"] not in ("met", "holds", "reached (>= 10x)") for r in
                                     result["claims"]):
        parts.append("Why a goal is missed is for a person to write from these figures (the kernel table, eager "
                     "against compiled, torch's own MFU at the same size, the batch that fitted): the command does "
                     "not guess.")
    return "\n\n".join(parts) + "\n"


def _fmt_fit(fit: dict | None) -> str:
    if not fit:
        return ""
    lo, hi = fit["ci95"]
    ci = f" [{lo:.2f}, {hi:.2f}]" if math.isfinite(lo) else ""
    return f"{fit['exponent']:.2f}{ci}, n in [{fit['x_min']:g}, {fit['x_max']:g}]"
