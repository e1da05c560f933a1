"""`mhalab bench complexity`: the cost of one attention layer against n, of equal-cost heads, and of decoding.

  scaling     one attention layer over a grid of n x d_model x n_heads x d_head x n_kv_heads x backend: FLOPs counted
              by FlopCounterMode beside the closed form of mhalab.cost, forward and forward+backward time
              (interleaved rounds, `timing.interleaved`), peak memory, the SDPA kernel that ran, and log-log fits of
              time and memory against n (`fit.loglog_fit`).
  equal_cost  n_heads * d_head = width fixed: FLOPs, time and memory relative to the fewest heads.
  decode      a causal LanguageModel with a KV cache (`decode.py`), MHA -> GQA -> MQA.

Peak memory on the CPU: torch's CPU allocations are invisible to tracemalloc, so each case's memory is measured in a
fresh Python process: after a warm-up on a tiny input the peak-RSS mark is reset (/proc/self/clear_refs), and the
growth of VmHWM over VmRSS is the peak of everything the case allocates beyond its inputs and parameters; that
process runs with MALLOC_MMAP_THRESHOLD_=65536 so freed tensors leave RSS. On CUDA everything runs in this process
(max_memory_allocated). A case whose predicted peak (`cost.attention_peak_bytes`) exceeds `free_fraction` of the
free memory, or `max_case_gib`, is skipped, saying so.
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import subprocess
import sys
import time

import torch

from mhalab.attention import MultiHeadAttention
from mhalab.bench import output
from mhalab.bench.fit import local_exponents, loglog_fit
from mhalab.bench.output import SCALING_METRICS, SHAPE_KEYS
from mhalab.bench.timing import (MIB, interleaved, kernel_name, loadavg, memory_limit, out_of_memory, peak_rss_mib,
                                 release, reset_peak_rss, resolve_device, resolve_dtype, rss_mib, sdpa_context,
                                 sdpa_kernels, size, summary_ms)
from mhalab.cost import attention_flops, attention_peak_bytes, attention_score_bytes, attention_train_flops, \
    measured_flops
from mhalab.heads import resolve_heads
from mhalab.bench.config import ComplexityConfig

# In the memory process every allocation of 64 KiB or more is its own mmap, returned to the OS when freed, so RSS
# follows the live tensors; glibc's default (a threshold rising to 32 MiB) kept freed blocks and made peaks erratic.
MEMORY_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}


# -- one attention-layer case ----------------------------------------------------------------------------------

def build_case(spec: dict):
    """The layer, its input x (B, n, d_model; requires grad), and fwd() / fwdbwd() closures."""
    device, dtype = torch.device(spec["device"]), resolve_dtype(spec["dtype"])
    torch.manual_seed(spec.get("seed", 0))
    B, n, d_model = spec["batch"], spec["n"], spec["d_model"]
    attn = MultiHeadAttention(d_model, spec["n_heads"], spec["n_kv_heads"], spec["d_head"],
                              backend=spec["backend"]).to(device, dtype)
    x = torch.randn(B, n, d_model, device=device, dtype=dtype, requires_grad=True)  # (B, n, d_model)
    gy = torch.randn(B, n, d_model, device=device, dtype=dtype)  # (B, n, d_model)

    def fwd(inp=x):
        with torch.no_grad():
            attn(inp)

    def fwdbwd(inp=x, grad=gy):
        attn.zero_grad(set_to_none=True)
        inp.grad = None
        y, _ = attn(inp)
        y.backward(grad)

    return attn, x, fwd, fwdbwd


def count_case(spec: dict) -> dict:
    """FLOPs of one case counted by FlopCounterMode (mhalab.cost.measured_flops) beside the closed forms, and the
    SDPA kernel that ran."""
    _, _, fwd, fwdbwd = build_case(spec)
    n, B = spec["n"], spec["batch"]
    shape = (spec["d_model"], spec["n_heads"], spec["d_head"], spec["n_kv_heads"])
    with sdpa_context(spec.get("sdpa_kernel")):
        row = {"flops_fwd_closed": B * attention_flops(n, *shape)["total"],
               "flops_fwdbwd_closed": B * attention_train_flops(n, *shape, recompute_scores=spec["backend"] == "sdpa"),
               "flops_fwd_counted": measured_flops(fwd), "flops_fwdbwd_counted": measured_flops(fwdbwd),
               "kernel": kernel_name(sdpa_kernels(fwdbwd), spec["backend"])}
    row["flops_match"] = row["flops_fwd_counted"] == row["flops_fwd_closed"]
    row["flops_fwdbwd_match"] = row["flops_fwdbwd_counted"] == row["flops_fwdbwd_closed"]
    return row


def case_memory(spec: dict) -> dict:
    """Peak memory of one forward (no grad) and of one forward+backward, in MiB beyond inputs and parameters.

    CPU: peak RSS growth (VmHWM - VmRSS after resetting the mark), meaningful in a fresh process (`run_memory`).
    CUDA: max_memory_allocated - memory_allocated after a warm-up.
    """
    device, dtype = torch.device(spec["device"]), resolve_dtype(spec["dtype"])
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    attn, x, fwd, fwdbwd = build_case(spec)
    B, d_model = spec["batch"], spec["d_model"]
    row = {}
    with sdpa_context(spec.get("sdpa_kernel")):
        if device.type == "cpu":
            tiny = torch.randn(B, 8, d_model, dtype=dtype, requires_grad=True)  # (B, 8, d_model)
            fwd(tiny)
            fwdbwd(tiny, torch.randn(B, 8, d_model, dtype=dtype))  # start thread pools, kernels, grad buffers
            attn.zero_grad(set_to_none=True)
            del tiny
            gc.collect()
            reset_peak_rss()
            base = rss_mib()
            fwd()
            row["mem_fwd_mib"] = peak_rss_mib() - base
            fwdbwd()
            row["mem_fwdbwd_mib"] = peak_rss_mib() - base
        else:
            fwd(), fwdbwd()  # warm-up
            attn.zero_grad(set_to_none=True)
            x.grad = None
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            for key, fn in (("mem_fwd_mib", fwd), ("mem_fwdbwd_mib", fwdbwd)):
                fn()
                torch.cuda.synchronize(device)
                row[key] = (torch.cuda.max_memory_allocated(device) - base) / MIB
    return row


def _case_main(arg: str) -> None:
    """Entry point of the fresh process that measures one case's memory: prints it as JSON on the last line."""
    print(json.dumps(case_memory(json.loads(arg))))


def run_memory(spec: dict) -> dict:
    """case_memory in a fresh Python process (CPU) or in this one (CUDA); {} for memory=none."""
    if spec["memory"] == "none":
        return {}
    if spec["device"] != "cpu":
        return case_memory(spec)
    code = "import sys; from mhalab.bench.complexity import _case_main; _case_main(sys.argv[1])"
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(spec)], capture_output=True, text=True,
                          env={**os.environ, **MEMORY_ENV})
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark case {spec} failed in its memory subprocess:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def time_cases(specs: list[dict], rounds: int, warmup: int, min_time_s: float, device: torch.device,
               sdpa_kernel: str | None = None) -> list[dict]:
    """Forward and forward+backward time of every case, interleaved over `rounds` (`timing.interleaved`); each
    row holds the median, min and quartiles over rounds in ms."""
    built = [build_case(s) for s in specs]
    with sdpa_context(sdpa_kernel):
        fns = [f for _, _, fwd, fwdbwd in built for f in (fwd, fwdbwd)]
        samples = interleaved(fns, rounds, device, min_time_s=min_time_s, warmup=warmup)
    del built, fns
    release(device)
    return [{**summary_ms("fwd", samples[2 * i]), **summary_ms("fwdbwd", samples[2 * i + 1])}
            for i in range(len(specs))]


def attention_case(spec: dict) -> dict:
    """One case on its own: memory (per spec["memory"], in this process), FLOPs and kernel, and times over
    spec["repeats"] rounds."""
    row = case_memory(spec) if spec["memory"] != "none" else {}
    row.update(count_case(spec))
    row.update(time_cases([spec], spec["repeats"], spec["warmup"], spec.get("min_time_s", 0.0),
                          torch.device(spec["device"]), spec.get("sdpa_kernel"))[0])
    return row


# -- sections --------------------------------------------------------------------------------------------------

def _base_spec(cfg, device: torch.device) -> dict:
    return {"device": "cpu" if device.type == "cpu" else f"cuda:{device.index or 0}", "dtype": cfg.dtype,
            "threads": cfg.threads, "seed": cfg.seed, "warmup": cfg.warmup, "repeats": cfg.repeats,
            "memory": cfg.memory, "sdpa_kernel": cfg.sdpa_kernel, "min_time_s": cfg.min_time_s}


def _describe(spec: dict) -> str:
    return (f"{spec['backend']:<4} n={spec['n']:<6} d_model={spec['d_model']} heads={spec['n_heads']} "
            f"d_head={spec['d_head']} kv={spec['n_kv_heads']} B={spec['batch']}")


def run_cases(specs: list[dict], cfg, label: str) -> tuple[list[dict], list[str]]:
    """Memory (a fresh process per case on the CPU), FLOPs and kernel case by case, then the times of all cases
    interleaved. Returns (rows, notes on skipped cases)."""
    rows, kept, skipped = [], [], []
    for i, spec in enumerate(specs):
        head = f"[{label} {i + 1}/{len(specs)}] {_describe(spec)}"
        elt = torch.empty((), dtype=resolve_dtype(spec["dtype"])).element_size()
        need = attention_peak_bytes(spec["n"], spec["d_model"], spec["n_heads"], spec["d_head"], spec["backend"],
                                    elt, spec["batch"])
        limit = memory_limit(cfg, torch.device(spec["device"]))
        if need > limit:
            skipped.append(f"{label}: {_describe(spec)} skipped: predicted peak {size(need)} > {size(limit)} "
                           f"allowed (free_fraction={cfg.free_fraction} of free memory"
                           f"{f', max_case_gib={cfg.max_case_gib}' if cfg.max_case_gib else ''})")
            print(f"{head}: skipped", flush=True)
            continue
        row = {k: spec[k] for k in ("n",) + SHAPE_KEYS}
        row["scores_mib"] = attention_score_bytes(spec["n"], spec["n_heads"], elt, batch_size=spec["batch"]) / MIB
        try:
            row.update(run_memory(spec))
            row.update(count_case(spec))
        except RuntimeError as e:
            if not out_of_memory(e):
                raise
            skipped.append(f"{label}: {_describe(spec)} skipped: out of memory although predicted to fit "
                           f"({size(need)})")
            print(f"{head}: {skipped[-1]}", flush=True)
            release(torch.device(spec["device"]))
            continue
        mem = (f", peak fwd/fwd+bwd {row['mem_fwd_mib']:.1f}/{row['mem_fwdbwd_mib']:.1f} MiB"
               if "mem_fwd_mib" in row else "")
        print(f"{head}: {row['kernel']}, FLOPs counted {'=' if row['flops_match'] else '!='} closed form{mem}",
              flush=True)
        rows.append(row)
        kept.append(spec)
        release(torch.device(spec["device"]))
    if kept:
        print(f"[{label}] timing {len(kept)} cases interleaved, {cfg.repeats} rounds", flush=True)
        times = time_cases(kept, cfg.repeats, cfg.warmup, cfg.min_time_s, torch.device(kept[0]["device"]),
                           cfg.sdpa_kernel)
        for row, spec, t in zip(rows, kept, times):
            row.update(t)
            print(f"[{label}] {_describe(spec)}: fwd {row['fwd_ms']:.2f} ms, fwd+bwd {row['fwdbwd_ms']:.2f} ms",
                  flush=True)
    return rows, skipped


def scaling_section(cfg, device: torch.device) -> tuple[list[dict], list[str]]:
    g = cfg.grid
    specs = []
    for backend, d_model, n_heads, d_head, n_kv, batch, n in itertools.product(
            cfg.backends, g.d_model, g.n_heads, g.d_head, g.n_kv_heads, g.batch, sorted(g.n)):
        n_kv_, d_head_ = resolve_heads(d_model, n_heads, n_kv, d_head, "grid.")
        specs.append(dict(_base_spec(cfg, device), backend=backend, n=n, d_model=d_model, n_heads=n_heads,
                          d_head=d_head_, n_kv_heads=n_kv_, batch=batch))
    return run_cases(specs, cfg, "scaling")


def scaling_fits(rows: list[dict], min_n: int | None) -> list[dict]:
    """Log-log fits of each metric against n for each (backend, shape) group: over n >= min_n and over all n."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in SHAPE_KEYS), []).append(r)
    fits = []
    for key, rs in groups.items():
        for metric, label in SCALING_METRICS:
            xs = [r["n"] for r in rs if metric in r]
            ys = [r[metric] for r in rs if metric in r]
            entry = dict(zip(SHAPE_KEYS, key), metric=metric, label=label, local=local_exponents(xs, ys))
            for name, lo in (("fit", min_n), ("fit_all", None)):
                try:
                    entry[name] = loglog_fit(xs, ys, min_x=lo)
                except ValueError:
                    entry[name] = None
            if entry["fit"] is not None or entry["fit_all"] is not None:
                fits.append(entry)
    return fits


def equal_cost_section(cfg, device: torch.device) -> tuple[list[dict], list[str]]:
    e = cfg.equal_cost
    specs = [dict(_base_spec(cfg, device), backend=backend, n=n, d_model=e.width, n_heads=h, d_head=e.width // h,
                  n_kv_heads=h, batch=e.batch)
             for backend, n, h in itertools.product(cfg.backends, sorted(e.n), sorted(e.n_heads))]
    rows, skipped = run_cases(specs, cfg, "equal_cost")
    for backend, n in itertools.product(cfg.backends, e.n):
        group = [r for r in rows if r["backend"] == backend and r["n"] == n]
        ref = min(group, key=lambda r: r["n_heads"], default=None)
        for r in group:
            r["ref_heads"] = ref["n_heads"]
            for m in ("fwd_ms", "fwdbwd_ms", "mem_fwd_mib", "mem_fwdbwd_mib"):
                if m in r and ref.get(m):
                    r[f"{m}_ratio"] = r[m] / ref[m]
            r["flops_equal_to_ref"] = r["flops_fwd_counted"] == ref["flops_fwd_counted"]
    return rows, skipped


def run_complexity(cfg: ComplexityConfig) -> dict:
    """The sections of `cfg.sections`, then the report, results.csv/json and plots in the output folder."""
    from mhalab.bench.decode import decode_section

    device = resolve_device(cfg.device)
    out, info = output.start(cfg, "complexity", device)
    result = {"subcommand": "complexity", "machine": info, "config": output.plain(cfg), "out_dir": str(out),
              "skipped": []}
    t0 = time.perf_counter()
    for name, section in (("scaling", scaling_section), ("equal_cost", equal_cost_section),
                          ("decode", decode_section)):
        if name in cfg.sections:
            result[name], skipped = section(cfg, device)
            result["skipped"] += skipped
    result["wall_s"] = time.perf_counter() - t0
    info["loadavg_end"] = loadavg()
    if result.get("scaling"):
        result["fits"] = scaling_fits(result["scaling"], cfg.fit_min_n)
    report = output.complexity_report(result)
    print(report, flush=True)
    output.write(out, result, report, [(s, result.get(s)) for s in ("scaling", "equal_cost", "decode")])
    if cfg.plots:
        result["plots"] = output.complexity_plots(result, out)
    return result
