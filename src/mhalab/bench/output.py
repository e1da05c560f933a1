"""What a benchmark leaves behind: the output folder, Markdown reports, results.csv / results.json, PNG plots.

Figures are matplotlib Figures with an Agg canvas (`mhalab.pictures.new_figure`): no pyplot state. Every
scaling plot is log-log, time and memory against n with the fitted power law; the decoding plots are log-log too
(latency and cache size against n_kv_heads).
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from pathlib import Path

from mhalab.bench.fit import format_fit

BASELINE = "torch.nn.TransformerEncoder"

# a complexity case's shape, and the metrics fitted against n (mhalab.bench.complexity)
SHAPE_KEYS = ("backend", "d_model", "n_heads", "d_head", "n_kv_heads", "batch")
SCALING_METRICS = (("flops_fwd_closed", "FLOPs fwd (closed form)"), ("fwd_ms", "time fwd"),
                   ("fwdbwd_ms", "time fwd+bwd"), ("fwd_ms_min", "time fwd (min over rounds)"),
                   ("fwdbwd_ms_min", "time fwd+bwd (min over rounds)"), ("mem_fwd_mib", "memory fwd"),
                   ("mem_fwdbwd_mib", "memory fwd+bwd"))


def start(cfg, sub: str, device) -> tuple[Path, dict]:
    """Threads, output folder and machine description of a benchmark run, announced on stdout."""
    from mhalab.bench.timing import machine_info

    cfg.apply_threads()  # as `mhalab.cli` does for the command's own options; also for the configs gpu builds
    out = Path(cfg.out_dir) if cfg.out_dir else Path("outputs/bench") / f"{sub}-{datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=True)
    info = machine_info(device)
    print(f"mhalab bench {sub} -> {out}\nmachine: {info}", flush=True)
    load = (info.get("loadavg_start") or [0])[0]
    if load > (info["cpu_count"] or 1):
        print(f"warning: the load average ({load}) exceeds the {info['cpu_count']} CPUs: other work is running, so "
              "absolute times are inflated; the ratios of alternating rounds are the figures to read", flush=True)
    return out, info


def plain(cfg) -> dict:
    return dataclasses.asdict(cfg)


def md_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """A Markdown table (`mhalab.tables.Table`, escaped); columns are (key, header, format spec); booleans print as
    yes / NO, a missing value as an empty cell."""
    from mhalab.tables import Table

    def cell(r, key, fmt):
        v = r.get(key)
        if v is None:
            return ""
        if isinstance(v, bool):
            return "yes" if v else "NO"
        try:
            return format(v, fmt)
        except (TypeError, ValueError):
            return str(v)

    table = Table([h for _, h, _ in columns])
    for r in rows:
        table.add([cell(r, k, f) for k, _, f in columns])
    return table.markdown()


def machine_line(m: dict) -> str:
    return (f"machine: {m.get('gpu') or m['cpu']}, {m['cpu_count']} CPUs, torch {m['torch']} "
            f"({m['torch_threads']} threads), device {m['device']}; load average {m.get('loadavg_start')} at start, "
            f"{m.get('loadavg_end')} at end")


SCALING_COLUMNS = [
    ("backend", "backend", ""), ("n", "n", "d"), ("d_model", "d_model", "d"), ("n_heads", "heads", "d"),
    ("d_head", "d_head", "d"), ("n_kv_heads", "kv", "d"), ("batch", "B", "d"), ("kernel", "kernel", ""),
    ("flops_fwd_closed", "FLOPs fwd (closed)", ".4g"), ("flops_match", "counted = closed", ""),
    ("flops_fwdbwd_match", "fwd+bwd counted = closed", ""), ("fwd_ms", "fwd ms", ".3f"),
    ("fwdbwd_ms", "fwd+bwd ms", ".3f"), ("mem_fwd_mib", "peak fwd MiB", ".1f"),
    ("mem_fwdbwd_mib", "peak fwd+bwd MiB", ".1f"), ("scores_mib", "one n x n score MiB", ".1f")]
EQUAL_COST_COLUMNS = [
    ("backend", "backend", ""), ("n", "n", "d"), ("n_heads", "heads", "d"), ("d_head", "d_head", "d"),
    ("kernel", "kernel", ""), ("flops_fwd_counted", "FLOPs fwd (counted)", ".4g"),
    ("flops_equal_to_ref", "= fewest heads", ""), ("fwd_ms", "fwd ms", ".2f"), ("fwd_ms_ratio", "fwd ratio", ".2f"),
    ("fwdbwd_ms", "fwd+bwd ms", ".2f"), ("fwdbwd_ms_ratio", "fwd+bwd ratio", ".2f"),
    ("mem_fwdbwd_mib", "peak fwd+bwd MiB", ".1f"), ("mem_fwdbwd_mib_ratio", "mem ratio", ".2f"),
    ("scores_mib", "one score tensor MiB", ".1f")]
DECODE_COLUMNS = [
    ("backend", "backend", ""), ("batch", "B", "d"), ("context", "context", "d"), ("n_kv_heads", "kv heads", "d"),
    ("cache_filled_by", "cache from", ""), ("cache_mib", "cache MiB", ".2f"),
    ("cache_ratio_vs_mha", "cache / MHA", ".3f"), ("latency_ms", "ms / token", ".3f"),
    ("speedup_vs_mha", "speed-up vs MHA", ".2f"), ("tokens_per_s", "tokens/s", ".0f"),
    ("implied_gb_per_s", "bytes read / latency GB/s", ".1f"), ("prefill_ms", "prefill ms", ".0f"),
    ("max_abs_diff_vs_full", "max |logit diff| vs full pass", ".1e")]


def fit_rows(fits: list[dict]) -> list[dict]:
    return [{"backend": f["backend"], "shape": f"d={f['d_model']} h={f['n_heads']} dh={f['d_head']} "
             f"kv={f['n_kv_heads']} B={f['batch']}", "metric": f["label"],
             "fit": format_fit(f["fit"]) if f["fit"] else "", "fit_all": format_fit(f["fit_all"]) if f["fit_all"]
             else "", "local": ", ".join(f"{s:.2f}" for _, _, s in f["local"])} for f in fits]


FIT_COLUMNS = [("backend", "backend", ""), ("shape", "shape", ""), ("metric", "metric", ""),
               ("fit", "b over the fit range", ""), ("fit_all", "b over all n", ""),
               ("local", "local slopes between consecutive n", "")]


def complexity_report(result: dict) -> str:
    c = result["config"]
    parts = [f"# mhalab bench complexity\n\n{machine_line(result['machine'])}; dtype {c['dtype']}; "
             f"memory={c['memory']}; times are medians over {c['repeats']} rounds that time every case of a section "
             "once, interleaved"]
    if result.get("scaling"):
        parts.append("## Scaling with n (one attention layer)\n\n" + md_table(result["scaling"], SCALING_COLUMNS))
        parts.append("## Fitted exponents (y ~ c n^b, least squares on log-log)\n\n"
                     + md_table(fit_rows(result["fits"]), FIT_COLUMNS))
    if result.get("equal_cost"):
        parts.append("## Equal cost: fixed n_heads x d_head (ratios to the fewest heads)\n\n"
                     + md_table(result["equal_cost"], EQUAL_COST_COLUMNS))
    if result.get("decode"):
        parts.append("## Incremental decoding with a KV cache (per-token latency, median)\n\n"
                     + md_table(result["decode"], DECODE_COLUMNS))
        bad = [r for r in result["decode"] if r["cache_bytes"] != r["cache_bytes_closed"]]
        parts.append("cache bytes = mhalab.cost.kv_cache_bytes: " + ("yes, every case" if not bad
                                                                      else f"NO in {len(bad)} case(s)"))
    if result.get("skipped"):
        parts.append("## Skipped (would not fit in memory)\n\n" + "\n".join(f"- {s}" for s in result["skipped"]))
    parts.append(f"wall time {result['wall_s']:.0f} s")
    return "\n\n".join(parts) + "\n"


TRAIN_COLUMNS = [
    ("n_heads", "heads", "d"), ("model", "model", ""), ("params", "params", ","), ("step_ms", "ms / step", ".1f"),
    ("tokens_per_s", "tokens/s", ".0f"), ("ratio_vs_baseline", f"ratio vs {BASELINE}", ".3f"),
    ("round_ratio", "per-round ratio median [min, max]", ""), ("achieved_tflops", "TFLOP/s", ".4g"),
    ("mfu", "MFU (vs measured peak)", ".1%")]
STATS_COLUMNS = [
    ("n_heads", "heads", "d"), ("stats_pass_ms", "statistics pass ms (median)", ".1f"),
    ("every_n_steps", "every n steps", "d"), ("stats_fraction", "share of training time", ".2%"),
    ("importance_s", "end of training: importance s", ".2f"), ("plots_s", "pictures s", ".2f")]


def train_report(result: dict) -> str:
    m, c = result["machine"], result["config"]
    head = (f"# mhalab bench train: mhalab vs {BASELINE}\n\n{machine_line(m)}; measured {m['peak_dtype']} matmul "
            f"peak {m['peak_matmul_tflops_measured']:.4g} TFLOP/s\n\n"
            f"objective={c['objective']} d_model={c['d_model']} n_layers={c['n_layers']} d_ff={c['d_ff']} "
            f"seq_len={c['seq_len']} batch={c['batch']} vocab={c['vocab_size']} dropout={c['dropout']} "
            f"attn_dropout={c['attn_dropout']} norm={c['norm']} pos={c['pos']} backend={c['backend']} "
            f"compile={c['compile']} ({c['compile_backend']}) amp_bf16={c['amp_bf16']}; AdamW, cross-entropy; median "
            f"over {c['rounds']} alternating rounds of {c['steps_per_round']} steps. Both models are built from one "
            f"Architecture; the baseline replaces the blocks with {BASELINE}. mhalab+stats adds the statistics "
            f"callback's pass (HeadStatsCallback.measure, probe of {c['stats']['probe_size']}) every "
            f"{c['stats']['every_n_steps']} steps.")
    parts = [head, md_table(result["rows"], TRAIN_COLUMNS)]
    if result.get("stats"):
        parts.append("## The statistics callback's cost\n\n" + md_table(result["stats"], STATS_COLUMNS))
    parts.append(f"wall time {result['wall_s']:.0f} s")
    return "\n\n".join(parts) + "\n"


def write(out: Path, result: dict, report: str, sections: list[tuple[str, list[dict] | None]]) -> None:
    """results.csv (one row per case, a `section` column first), results.json (everything), report.md."""
    import pandas as pd

    frames = [pd.DataFrame(rows).assign(section=name) for name, rows in sections if rows]
    if frames:
        df = pd.concat(frames, ignore_index=True)
        df.insert(0, "section", df.pop("section"))
        df.to_csv(out / "results.csv", index=False)
    (out / "results.json").write_text(json.dumps(result, indent=1, default=json_default))
    (out / "report.md").write_text(report)


def json_default(o):
    if isinstance(o, (tuple, set)):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


# -- plots -----------------------------------------------------------------------------------------------------

def _save(fig, path: Path) -> str:
    fig.savefig(path, dpi=90)
    return str(path)


def _loglog(ax, xlabel: str, ylabel: str, title: str, x_base: int = 2) -> None:
    ax.set_xscale("log", base=x_base)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def complexity_plots(result: dict, out: Path) -> list[str]:
    paths = []
    if result.get("scaling"):
        paths += _scaling_plots(result, out)
    if result.get("equal_cost"):
        paths.append(_equal_cost_plot(result["equal_cost"], out))
    if result.get("decode"):
        paths.append(_decode_plot(result["decode"], out))
    return paths


def _scaling_plots(result: dict, out: Path) -> list[str]:
    from mhalab.pictures import new_figure

    fits = {tuple(f[k] for k in SHAPE_KEYS) + (f["metric"],): f for f in result["fits"]}
    groups: dict[tuple, list[dict]] = {}
    for r in result["scaling"]:
        groups.setdefault(tuple(r[k] for k in SHAPE_KEYS), []).append(r)
    paths = []
    for name, metrics, unit in (("scaling_time.png", ("fwd_ms", "fwdbwd_ms"), "ms"),
                                ("scaling_memory.png", ("mem_fwd_mib", "mem_fwdbwd_mib"), "MiB")):
        if not any(metrics[0] in r for r in result["scaling"]):
            continue
        fig = new_figure(figsize=(11, 4.5), layout="constrained")
        for ax, metric in zip(fig.subplots(1, 2), metrics):
            for key, rows in groups.items():
                pts = sorted((r["n"], r[metric]) for r in rows if r.get(metric, 0) > 0)
                if not pts:
                    continue
                label = key[0] if len(groups) <= len(result["config"]["backends"]) else \
                    "{} d={} h={} dh={} kv={} B={}".format(*key)
                line, = ax.plot(*zip(*pts), "o", label=label)
                f = fits.get(key + (metric,))
                fit = f and (f["fit"] or f["fit_all"])
                if fit:
                    xs = [fit["x_min"], fit["x_max"]]
                    ax.plot(xs, [fit["prefactor"] * x ** fit["exponent"] for x in xs], "-", color=line.get_color(),
                            label=f"{label} fit: n^{fit['exponent']:.2f}")
                if unit == "ms":  # time proportional to the closed-form FLOPs, pinned at the largest n
                    ref = max(rows, key=lambda r: r["n"])
                    flops = sorted((r["n"], r["flops_fwd_closed"] * ref[metric] / ref["flops_fwd_closed"])
                                   for r in rows)
                    ax.plot(*zip(*flops), ":", color=line.get_color(), lw=1, label=f"{label}: time if ∝ FLOPs")
            _loglog(ax, "sequence length n", f"{'peak memory growth' if unit == 'MiB' else 'median time'} ({unit})",
                    dict(SCALING_METRICS)[metric])
        paths.append(_save(fig, out / name))
    return paths


def _equal_cost_plot(rows: list[dict], out: Path) -> str:
    from mhalab.pictures import new_figure

    metrics = [m for m in ("fwd_ms_ratio", "fwdbwd_ms_ratio", "mem_fwdbwd_mib_ratio") if any(m in r for r in rows)]
    titles = {"fwd_ms_ratio": "forward time", "fwdbwd_ms_ratio": "forward+backward time",
              "mem_fwdbwd_mib_ratio": "peak memory (fwd+bwd)"}
    fig = new_figure(figsize=(4.5 * len(metrics), 4.2), layout="constrained")
    for ax, metric in zip(fig.subplots(1, len(metrics), squeeze=False)[0], metrics):
        for backend, n in sorted({(r["backend"], r["n"]) for r in rows}):
            pts = sorted((r["n_heads"], r[metric]) for r in rows if r["backend"] == backend and r["n"] == n
                         and metric in r)
            if pts:
                ax.plot(*zip(*pts), "o-", label=f"{backend} n={n}")
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        _loglog(ax, f"n_heads (n_heads x d_head = {rows[0]['d_model']})", "ratio to the fewest heads",
                titles[metric] + ", equal FLOPs")
        ax.set_yscale("log", base=2)
    return _save(fig, out / "equal_cost.png")


def _decode_plot(rows: list[dict], out: Path) -> str:
    return _save(decode_figure(rows), out / "decode.png")


def decode_figure(rows: list[dict]):
    """Latency and KV-cache size against n_kv_heads, both axes logarithmic (MHA on the left, MQA on the right)."""
    from mhalab.pictures import new_figure

    backends = sorted({r["backend"] for r in rows})
    shapes = sorted({(r["batch"], r["context"]) for r in rows})
    colour = {shape: f"C{i % 10}" for i, shape in enumerate(shapes)}  # one colour a shape in every panel
    fig = new_figure(figsize=(5 * len(backends) + 1, 8), layout="constrained")
    axes = fig.subplots(2, len(backends), squeeze=False)
    for j, backend in enumerate(backends):
        for B, L in sorted({(r["batch"], r["context"]) for r in rows if r["backend"] == backend}):
            sel = sorted((r for r in rows if (r["backend"], r["batch"], r["context"]) == (backend, B, L)),
                         key=lambda r: r["n_kv_heads"])
            kv = [r["n_kv_heads"] for r in sel]
            style = {"label": f"B={B} L={L}", "color": colour[B, L]}
            axes[0, j].plot(kv, [r["latency_ms"] for r in sel], "o-", **style)
            axes[1, j].plot(kv, [r["cache_mib"] for r in sel], "o-", **style)
        for i, ylabel in enumerate(("ms per token (median)", "KV cache MiB (all layers)")):
            _loglog(axes[i, j], "n_kv_heads (n_heads = MHA ... 1 = MQA)", ylabel, f"decode, backend={backend}")
            axes[i, j].invert_xaxis()
    return fig


def train_plots(result: dict, out: Path) -> list[str]:
    from mhalab.pictures import new_figure

    rows = result["rows"]
    heads = sorted({r["n_heads"] for r in rows})
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig = new_figure(figsize=(7, 4), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / len(models)
    for i, name in enumerate(models):
        vals = [next(r["tokens_per_s"] for r in rows if r["n_heads"] == h and r["model"] == name) for h in heads]
        ax.bar([k + i * width for k in range(len(heads))], vals, width, label=name)
    ax.set_xticks([k + width * (len(models) - 1) / 2 for k in range(len(heads))], [f"{h} heads" for h in heads])
    ax.set_ylabel("training tokens/s (median)")
    ax.set_title("training throughput")
    ax.legend(fontsize=8)
    return [_save(fig, out / "train_throughput.png")]
