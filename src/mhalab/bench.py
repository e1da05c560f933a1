"""Benchmarks that put numbers on the cost claims of docs/definitions.md#cost-model, on the machine at hand.

    python -m mhalab.bench complexity [key=value ...]   # conf/bench/complexity.yaml
    python -m mhalab.bench train      [key=value ...]   # conf/bench/train.yaml

`complexity` has three sections (`sections=[scaling,equal_cost,decode]`):
  scaling     one attention layer over a grid of n x d_model x n_heads x d_head x n_kv_heads x backend: FLOPs counted
              by FlopCounterMode beside the closed form of mhalab.cost, forward and forward+backward time (warm-up,
              then the median over `repeats` rounds that time every case once, interleaved, so that load from
              other work on a shared machine falls on all cases alike; CUDA events on GPU), peak memory, and a
              log-log fit of time and memory against n.
  equal_cost  fixed n_heads * d_head = width, n_heads in {1, 2, ..., 32}: FLOPs, time and memory relative to 1 head.
  decode      causal LanguageModel with a KV cache: prefill L tokens, then per-token latency and cache bytes for
              n_kv_heads in {n_heads, n_heads/2, ..., 1} (MHA -> GQA -> MQA).
`train` times training steps of the mhalab encoder against torch.nn.TransformerEncoder (same sizes, same optimizer
and loss), alternating in rounds in one process, with mhalab's head-statistics pass at its default cadence.

Overrides use OmegaConf dotlist syntax, e.g. `grid.n=[64,128] backends=[math] out_dir=/tmp/b`; an unknown key is
an error. Results go to `out_dir` (default outputs/bench/<subcommand>-<timestamp>): results.csv, results.json,
report.md (the printed Markdown) and PNG plots.

Peak memory on CPU (`memory=rss`): torch's CPU allocations are invisible to tracemalloc, so every case's memory is
measured in a fresh Python process: after a warm-up on a tiny input (which starts the thread pools and kernels) the
peak-RSS mark is reset (/proc/self/clear_refs) and the growth of VmHWM over VmRSS is the peak of everything the case
allocates beyond its inputs and parameters; that process runs with MALLOC_MMAP_THRESHOLD_=65536 so freed tensors
leave RSS. Times and FLOPs are measured in the main process. On CUDA everything runs in process
(max_memory_allocated). On a small shared CPU use `threads=1`: with several OpenMP threads a descheduled thread
stalls the others at every barrier and times become meaningless.
"""

from __future__ import annotations

import gc
import itertools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from mhalab.attention import BACKENDS, MultiHeadAttention
from mhalab.cost import attention_flops, feedforward_flops, kv_cache_bytes, measured_flops
from mhalab.errors import ConfigError
from mhalab.fit import format_fit, local_exponents, loglog_fit
from mhalab.model import Encoder, EncoderConfig, LanguageModel
from mhalab.stats import head_stats
from mhalab.plots import new_figure

SUBCOMMANDS = ("complexity", "train")
SECTIONS = ("scaling", "equal_cost", "decode")
BASELINE = "torch.nn.TransformerEncoder"
MIB = 2.0 ** 20


def conf_dir() -> Path:
    """The repository's conf/bench, found relative to this file (src/mhalab/bench.py -> <repo>/conf/bench)."""
    path = Path(__file__).resolve().parents[2] / "conf" / "bench"
    if not path.is_dir():
        raise ConfigError(f"benchmark configs not found at {path}: run from a source checkout of mhalab "
                          "(pip install -e .), which has conf/bench/complexity.yaml and conf/bench/train.yaml")
    return path


def load_config(name: str, overrides: list[str] | tuple[str, ...] = ()):
    """conf/bench/<name>.yaml with `key=value` overrides (OmegaConf dotlist; unknown keys are an error)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    path = conf_dir() / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"benchmark config {path} not found: subcommands are {', '.join(SUBCOMMANDS)}")
    cfg = OmegaConf.load(path)
    OmegaConf.set_struct(cfg, True)
    bad = [o for o in overrides if "=" not in o or o.startswith("=")]
    if bad:
        raise ConfigError(f"override {bad[0]!r} is not of the form key=value (e.g. grid.n=[64,128])")
    try:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
    except OmegaConfBaseException as e:
        raise ConfigError(f"bad override for conf/bench/{name}.yaml: {str(e).splitlines()[0]}") from None
    return cfg


# ----------------------------------------------------------------------------------------------------------------
# measurement helpers


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={name!r}: CUDA is not available on this machine; use device=cpu or auto")
    if name != "cpu" and not name.startswith("cuda"):
        raise ConfigError(f"device={name!r}: device must be auto, cpu or cuda[:i]")
    return torch.device(name)


def resolve_dtype(name: str) -> torch.dtype:
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in table:
        raise ConfigError(f"dtype={name!r}: dtype must be one of {', '.join(table)}")
    return table[name]


def _start(cfg, subcommand: str, device: torch.device) -> tuple[Path, dict]:
    """Threads, output folder and machine description of a benchmark run, announced on stdout."""
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    out = _out_dir(cfg, subcommand)
    info = machine_info(device)
    print(f"mhalab.bench {subcommand} -> {out}\nmachine: {info}", flush=True)
    return out, info


def time_once(fn, device: torch.device) -> float:
    """Seconds for one call of fn: CUDA events on GPU, perf_counter on CPU."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / 1e3
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(fn, warmup: int, repeats: int, device: torch.device, min_time_s: float = 0.0,
            max_repeats: int = 1000) -> list[float]:
    """Seconds per call of fn: `warmup` untimed calls, then at least `repeats` timed ones, more (up to max_repeats)
    until min_time_s of timed calls have run, so fast cases get enough samples for a stable median on a busy
    machine. CUDA events on GPU."""
    for _ in range(warmup):
        fn()
    sync(device)
    out: list[float] = []
    while len(out) < repeats or (sum(out) < min_time_s and len(out) < max_repeats):
        out.append(time_once(fn, device))
    return out


def _proc_status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


def reset_peak_rss() -> None:
    """Reset this process's peak-RSS mark (VmHWM) to its current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def rss_mib() -> float:
    return _proc_status_kib("VmRSS") / 1024


def peak_rss_mib() -> float:
    return _proc_status_kib("VmHWM") / 1024


def sdpa_context(kernel: str | None):
    """torch.nn.attention.sdpa_kernel for one named kernel, or a no-op."""
    import contextlib

    if kernel is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    names = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
             "math": SDPBackend.MATH, "cudnn": SDPBackend.CUDNN_ATTENTION}
    if kernel not in names:
        raise ConfigError(f"sdpa_kernel={kernel!r}: must be null or one of {', '.join(names)}")
    return sdpa_kernel(names[kernel])


def machine_info(device: torch.device) -> dict:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    info = {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cpu": cpu, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "device": str(device)}
    try:
        with open("/proc/meminfo") as f:
            info["memory_gib"] = round(int(f.readline().split()[1]) / 2 ** 20, 1)
    except OSError:
        pass
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    info["loadavg_start"] = _loadavg()
    return info


def _loadavg() -> list[float] | None:
    """1, 5 and 15 minute load averages: how busy the (possibly shared) machine was."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def measure_peak_flops(device: torch.device, dtype: torch.dtype, size: int | None = None, repeats: int = 10) -> float:
    """Measured matmul throughput (FLOP/s) of a size x size GEMM in dtype, best of `repeats`: the denominator of
    MFU (the machine's own peak, not a datasheet number)."""
    size = size or (8192 if device.type == "cuda" else 3072)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    times = time_fn(lambda: a @ b, warmup=2, repeats=repeats, device=device)
    return 2.0 * size ** 3 / min(times)


def median(xs) -> float:
    return float(statistics.median(xs)) if len(xs) else float("nan")


def _quantile(xs, q: float) -> float:
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def kv_series(n_heads: int) -> list[int]:
    """n_heads, n_heads/2, ..., 1 (the divisors reached by halving)."""
    out, g = [], n_heads
    while g >= 1:
        if n_heads % g == 0:
            out.append(g)
        if g == 1:
            break
        g //= 2
    return out if out[-1] == 1 else out + [1]


# ----------------------------------------------------------------------------------------------------------------
# one attention-layer case (run in a fresh process for CPU memory)


def attention_train_flops(spec: dict) -> int:
    """Forward+backward FLOPs of one attention layer (input gradient included): 3x the forward matmuls, plus one
    more Q K^T for the fused SDPA kernels, whose backward recomputes the scores instead of storing them."""
    fwd = attention_flops(spec["n"], spec["d_model"], spec["n_heads"], spec["d_head"], spec["n_kv_heads"])
    recompute = fwd["scores"] if spec["backend"] == "sdpa" else 0
    return spec["batch"] * (3 * fwd["total"] + recompute)


def _build_case(spec: dict):
    """The layer, its input (requires grad) and an output gradient, plus fwd() and fwdbwd() closures."""
    device, dtype = torch.device(spec["device"]), resolve_dtype(spec["dtype"])
    torch.manual_seed(spec.get("seed", 0))
    B, n, d_model = spec["batch"], spec["n"], spec["d_model"]
    attn = MultiHeadAttention(d_model, spec["n_heads"], spec["n_kv_heads"], spec["d_head"],
                              backend=spec["backend"]).to(device, dtype)
    x = torch.randn(B, n, d_model, device=device, dtype=dtype, requires_grad=True)  # (B, n, d_model)
    gy = torch.randn(B, n, d_model, device=device, dtype=dtype)

    def fwd(inp=x):
        with torch.no_grad():
            attn(inp)

    def fwdbwd(inp=x, grad=gy):
        attn.zero_grad(set_to_none=True)
        inp.grad = None
        y, _ = attn(inp)
        y.backward(grad)

    return attn, x, fwd, fwdbwd


def count_case_flops(spec: dict) -> dict:
    """FLOPs of one case counted by FlopCounterMode (mhalab.cost.measured_flops) beside the closed forms."""
    _, _, fwd, fwdbwd = _build_case(spec)
    closed = attention_flops(spec["n"], spec["d_model"], spec["n_heads"], spec["d_head"], spec["n_kv_heads"])
    with sdpa_context(spec.get("sdpa_kernel")):
        return {"flops_fwd_closed": spec["batch"] * closed["total"], "flops_fwdbwd_closed": attention_train_flops(spec),
                "flops_fwd_counted": measured_flops(fwd), "flops_fwdbwd_counted": measured_flops(fwdbwd)}


def case_memory(spec: dict) -> dict:
    """Peak memory of one forward (no grad) and of one forward+backward, in MiB beyond inputs and parameters.

    CPU: peak RSS growth (VmHWM - VmRSS after resetting the mark); meaningful in a fresh process (run_memory runs
    it in one). CUDA: max_memory_allocated - memory_allocated after a warm-up.
    """
    device, dtype = torch.device(spec["device"]), resolve_dtype(spec["dtype"])
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    attn, x, fwd, fwdbwd = _build_case(spec)
    B, d_model = spec["batch"], spec["d_model"]
    row = {}
    with sdpa_context(spec.get("sdpa_kernel")):
        if device.type == "cpu":
            tiny = torch.randn(B, 8, d_model, dtype=dtype, requires_grad=True)
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
            fwd()
            torch.cuda.synchronize(device)
            row["mem_fwd_mib"] = (torch.cuda.max_memory_allocated(device) - base) / MIB
            fwdbwd()
            torch.cuda.synchronize(device)
            row["mem_fwdbwd_mib"] = (torch.cuda.max_memory_allocated(device) - base) / MIB
    return row


def _case_main(arg: str) -> None:
    """Entry point of the fresh process that measures one case's memory: prints it as JSON on the last line."""
    print(json.dumps(case_memory(json.loads(arg))))


# In the memory process every allocation of 64 KiB or more is its own mmap, returned to the OS when freed, so RSS
# follows the live tensors. glibc's default (a dynamic threshold that rises to 32 MiB after the first frees) keeps
# freed blocks resident and reuses them, which made mid-size peaks erratic from run to run.
MEMORY_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def run_memory(spec: dict) -> dict:
    """case_memory in a fresh Python process (CPU) or in this one (CUDA); {} for memory=none."""
    if spec["memory"] == "none":
        return {}
    if spec["device"] != "cpu":
        return case_memory(spec)
    code = "import sys; from mhalab.bench import _case_main; _case_main(sys.argv[1])"
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(spec)], capture_output=True, text=True,
                          env={**os.environ, **MEMORY_ENV})
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark case {spec} failed in its memory subprocess:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def time_cases(specs: list[dict], rounds: int, warmup: int, min_time_s: float, device: torch.device,
               sdpa_kernel: str | None = None) -> list[dict]:
    """Forward and forward+backward time of every case, interleaved: each round times every case once (forward
    order on even rounds, reverse on odd), so load from other work on a shared machine falls on all cases alike
    instead of on whichever ran during a busy spell. In a round a case repeats its call until min_time_s has
    passed and records the mean; the result is the median (and min, quartiles) over rounds."""
    built = [_build_case(s) for s in specs]
    samples = [{"fwd": [], "fwdbwd": []} for _ in specs]
    with sdpa_context(sdpa_kernel):
        for _, _, fwd, fwdbwd in built:
            for _ in range(warmup):
                fwd()
                fwdbwd()
        for r in range(rounds):
            order = range(len(specs)) if r % 2 == 0 else range(len(specs) - 1, -1, -1)
            for i in order:
                for kind, fn in (("fwd", built[i][2]), ("fwdbwd", built[i][3])):
                    calls, elapsed = 0, 0.0
                    while calls == 0 or elapsed < min_time_s:
                        elapsed += time_once(fn, device)
                        calls += 1
                    samples[i][kind].append(elapsed / calls)
    rows = []
    for smp in samples:
        row = {}
        for kind, ts in smp.items():
            row.update({f"{kind}_ms": 1e3 * median(ts), f"{kind}_ms_min": 1e3 * min(ts),
                        f"{kind}_ms_p25": 1e3 * _quantile(ts, 0.25), f"{kind}_ms_p75": 1e3 * _quantile(ts, 0.75)})
        rows.append(row)
    del built
    gc.collect()
    return rows


def attention_case(spec: dict) -> dict:
    """One case on its own: memory (per spec["memory"], in this process), FLOPs, and times over spec["repeats"]
    rounds. The complexity command uses run_memory + count_case_flops + time_cases instead."""
    device = torch.device(spec["device"])
    row = case_memory(spec) if spec["memory"] != "none" else {}
    row.update(count_case_flops(spec))
    row.update(time_cases([spec], spec["repeats"], spec["warmup"], spec.get("min_time_s", 0.0), device,
                          spec.get("sdpa_kernel"))[0])
    return row


def _predicted_gib(spec: dict, elt: int) -> float:
    """Rough peak of a case: the math path holds about 5 (B, H, n, n) score-sized tensors in forward+backward."""
    scores = spec["batch"] * spec["n_heads"] * spec["n"] ** 2 * elt
    act = 12 * spec["batch"] * spec["n"] * max(spec["d_model"], spec["n_heads"] * spec["d_head"]) * elt
    return ((5 * scores if spec["backend"] == "math" else 0) + act) / 2 ** 30


def _base_spec(cfg, device: torch.device) -> dict:
    return {"device": str(device) if device.type == "cpu" else f"cuda:{device.index or 0}", "dtype": cfg.dtype,
            "threads": cfg.threads, "seed": cfg.seed, "warmup": cfg.warmup, "repeats": cfg.repeats,
            "memory": cfg.memory, "sdpa_kernel": cfg.sdpa_kernel, "min_time_s": cfg.min_time_s}


def _describe(spec: dict) -> str:
    return (f"{spec['backend']:<4} n={spec['n']:<6} d_model={spec['d_model']} heads={spec['n_heads']} "
            f"d_head={spec['d_head']} kv={spec['n_kv_heads']} B={spec['batch']}")


def _run_cases(specs: list[dict], cfg, label: str) -> list[dict]:
    """Memory (fresh process per case) and FLOPs case by case, then the times of all cases interleaved."""
    elt = torch.tensor([], dtype=resolve_dtype(cfg.dtype)).element_size()
    rows, kept = [], []
    for i, spec in enumerate(specs):
        head = f"[{label} {i + 1}/{len(specs)}] {_describe(spec)}"
        gib = _predicted_gib(spec, elt)
        if gib > cfg.max_case_gib:
            print(f"{head}: skipped (about {gib:.1f} GiB > max_case_gib={cfg.max_case_gib})", flush=True)
            continue
        row = {k: spec[k] for k in ("backend", "n", "d_model", "n_heads", "d_head", "n_kv_heads", "batch")}
        row["scores_mib"] = spec["batch"] * spec["n_heads"] * spec["n"] ** 2 * elt / MIB
        row.update(run_memory(spec))
        row.update(count_case_flops(spec))
        row["flops_match"] = row["flops_fwd_counted"] == row["flops_fwd_closed"]
        row["flops_fwdbwd_match"] = row["flops_fwdbwd_counted"] == row["flops_fwdbwd_closed"]
        mem = (f", peak fwd/fwd+bwd {row['mem_fwd_mib']:.1f}/{row['mem_fwdbwd_mib']:.1f} MiB"
               if "mem_fwd_mib" in row else "")
        print(f"{head}: FLOPs counted {'=' if row['flops_match'] else '!='} closed form{mem}", flush=True)
        rows.append(row)
        kept.append(spec)
        gc.collect()
    if kept:
        device = torch.device(kept[0]["device"])
        print(f"[{label}] timing {len(kept)} cases interleaved, {cfg.repeats} rounds", flush=True)
        for row, spec, times in zip(rows, kept, time_cases(kept, cfg.repeats, cfg.warmup, cfg.min_time_s, device,
                                                             cfg.sdpa_kernel)):
            row.update(times)
            print(f"[{label}] {_describe(spec)}: fwd {row['fwd_ms']:.2f} ms, fwd+bwd {row['fwdbwd_ms']:.2f} ms",
                  flush=True)
    return rows


def _heads_and_width(d_model: int, n_heads: int, d_head, n_kv_heads) -> tuple[int, int]:
    if d_head is None:
        if d_model % n_heads:
            raise ConfigError(f"grid: d_model={d_model} is not divisible by n_heads={n_heads}; give grid.d_head")
        d_head = d_model // n_heads
    return d_head, (n_heads if n_kv_heads is None else n_kv_heads)


def scaling_section(cfg, device: torch.device) -> list[dict]:
    g = cfg.grid
    specs = []
    for backend, d_model, n_heads, d_head, n_kv, batch, n in itertools.product(
            cfg.backends, g.d_model, g.n_heads, g.d_head, g.n_kv_heads, g.batch, sorted(g.n)):
        d_head_, n_kv_ = _heads_and_width(d_model, n_heads, d_head, n_kv)
        if n_heads % n_kv_:
            continue
        specs.append(dict(_base_spec(cfg, device), backend=backend, n=n, d_model=d_model, n_heads=n_heads,
                          d_head=d_head_, n_kv_heads=n_kv_, batch=batch))
    return _run_cases(specs, cfg, "scaling")


SCALING_METRICS = (("flops_fwd_closed", "FLOPs fwd (closed form)"), ("fwd_ms", "time fwd"),
                   ("fwdbwd_ms", "time fwd+bwd"), ("fwd_ms_min", "time fwd (min over rounds)"),
                   ("fwdbwd_ms_min", "time fwd+bwd (min over rounds)"), ("mem_fwd_mib", "memory fwd"),
                   ("mem_fwdbwd_mib", "memory fwd+bwd"))


def _group_key(row: dict) -> tuple:
    return (row["backend"], row["d_model"], row["n_heads"], row["d_head"], row["n_kv_heads"], row["batch"])


def scaling_fits(rows: list[dict], min_n: int | None) -> list[dict]:
    """Log-log fits of each metric against n for each (backend, shape) group: over n >= min_n and over all n."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(_group_key(r), []).append(r)
    fits = []
    for key, rs in groups.items():
        for metric, label in SCALING_METRICS:
            xs = [r["n"] for r in rs if metric in r]
            ys = [r[metric] for r in rs if metric in r]
            entry = dict(zip(("backend", "d_model", "n_heads", "d_head", "n_kv_heads", "batch"), key))
            entry.update(metric=metric, label=label, local=local_exponents(xs, ys))
            for name, lo in (("fit", min_n), ("fit_all", None)):
                try:
                    entry[name] = loglog_fit(xs, ys, min_x=lo)
                except ValueError:
                    entry[name] = None
            if entry["fit"] is None and entry["fit_all"] is None:
                continue
            fits.append(entry)
    return fits


def equal_cost_section(cfg, device: torch.device) -> list[dict]:
    e = cfg.equal_cost
    specs = []
    for backend, n, h in itertools.product(cfg.backends, sorted(e.n), sorted(e.n_heads)):
        if e.width % h:
            raise ConfigError(f"equal_cost.width={e.width} is not divisible by n_heads={h}")
        specs.append(dict(_base_spec(cfg, device), backend=backend, n=n, d_model=e.width, n_heads=h,
                          d_head=e.width // h, n_kv_heads=h, batch=e.batch))
    rows = _run_cases(specs, cfg, "equal_cost")
    for backend, n in itertools.product(cfg.backends, e.n):
        group = [r for r in rows if r["backend"] == backend and r["n"] == n]
        ref = min(group, key=lambda r: r["n_heads"], default=None)
        for r in group:
            r["ref_heads"] = ref["n_heads"]
            for m in ("fwd_ms", "fwdbwd_ms", "mem_fwd_mib", "mem_fwdbwd_mib"):
                if m in r and ref.get(m):
                    r[f"{m}_ratio"] = r[m] / ref[m]
            if "flops_fwd_counted" in r:
                r["flops_equal_to_ref"] = r["flops_fwd_counted"] == ref["flops_fwd_counted"]
    return rows


def decode_group(specs: list[dict], device: torch.device, dtype: torch.dtype) -> list[dict]:
    """Decode with several models that differ only in n_kv_heads (same batch and context), interleaved.

    Each model prefills `context` tokens into its KV caches; then every step times one single-token step of each
    model in turn (order reversed on odd steps), so load from other work falls on all of them alike. Per model:
    median per-token latency over the timed steps, cache bytes at the end of the prefill, and (check) the largest
    logit difference between the first cached step and a full forward pass over the same tokens.
    """
    s0 = specs[0]
    L, B, steps, warm = s0["context"], s0["batch"], s0["steps"], s0["warmup_steps"]
    total = L + warm + steps
    torch.manual_seed(s0["seed"])
    ids = torch.randint(0, s0["vocab_size"], (B, total + 1), device=device)
    runs = []
    with torch.no_grad():
        for spec in specs:
            mcfg = EncoderConfig(vocab_size=spec["vocab_size"], max_len=total + 1, d_model=spec["d_model"],
                                 n_layers=spec["n_layers"], n_heads=spec["n_heads"], n_kv_heads=spec["n_kv_heads"],
                                 d_ff=spec["d_ff"], dropout=0.0, causal=True, backend=spec["backend"],
                                 pos=spec["pos"])
            torch.manual_seed(spec["seed"])
            model = LanguageModel(mcfg).to(device, dtype).eval()
            caches = model.encoder.new_caches(B, max_len=total)
            sync(device)
            t = time.perf_counter()
            model(ids[:, :L], caches=caches)
            sync(device)
            elt = torch.empty((), dtype=dtype).element_size()
            row = {"prefill_ms": 1e3 * (time.perf_counter() - t), "cache_bytes": sum(c.nbytes for c in caches),
                   "cache_bytes_closed": kv_cache_bytes(mcfg.n_kv_heads, mcfg.d_head, elt, n_tokens=L,
                                                        n_layers=mcfg.n_layers, batch_size=B),
                   "d_head": mcfg.d_head}
            runs.append({"spec": spec, "model": model, "caches": caches, "row": row, "times": [], "first": None})
        for i in range(warm + steps):
            tok = ids[:, L + i:L + i + 1]  # (B, 1)
            for run in (runs if i % 2 == 0 else runs[::-1]):
                sync(device)
                t = time.perf_counter()
                logits = run["model"](tok, caches=run["caches"]).logits  # (B, 1, V)
                sync(device)
                if i >= warm:
                    run["times"].append(time.perf_counter() - t)
                if run["first"] is None:
                    run["first"] = logits[:, 0].float()
        for run in runs:
            if run["spec"]["check"]:
                full = run["model"](ids[:, :L + 1]).logits[:, L].float()  # (B, V) the same position, no cache
                run["row"]["max_abs_diff_vs_full"] = (full - run["first"]).abs().max().item()
    out = []
    for run in runs:
        row, ts = run["row"], run["times"]
        param_bytes = sum(p.numel() * p.element_size() for p in run["model"].parameters())
        row.update(latency_ms=1e3 * median(ts), latency_ms_min=1e3 * min(ts), tokens_per_s=B / median(ts),
                   param_mib=param_bytes / MIB, cache_mib=row["cache_bytes"] / MIB,
                   # bytes a step must at least read: the whole cache plus every weight (the tied LM head included)
                   implied_gb_per_s=(row["cache_bytes"] + param_bytes) / median(ts) / 1e9)
        out.append(row)
    return out


def decode_case(spec: dict, device: torch.device, dtype: torch.dtype) -> dict:
    """decode_group for one model."""
    return decode_group([spec], device, dtype)[0]


def decode_section(cfg, device: torch.device) -> list[dict]:
    d, dtype = cfg.decode, resolve_dtype(cfg.dtype)
    kvs = list(d.n_kv_heads) if d.n_kv_heads is not None else kv_series(d.n_heads)
    bad = [g for g in kvs if d.n_heads % g]
    if bad:
        raise ConfigError(f"decode.n_kv_heads: {bad[0]} does not divide decode.n_heads={d.n_heads}")
    rows = []
    groups = list(itertools.product(cfg.backends, sorted(d.batch), sorted(d.context)))
    for i, (backend, B, L) in enumerate(groups):
        specs = [dict(backend=backend, batch=B, context=L, n_kv_heads=g, n_heads=d.n_heads, d_model=d.d_model,
                      n_layers=d.n_layers, d_ff=d.d_ff, vocab_size=d.vocab_size, pos=d.pos, steps=d.steps,
                      warmup_steps=d.warmup_steps, seed=cfg.seed, check=B * L <= d.check_max_tokens)
                 for g in kvs]
        group = []
        for spec, res in zip(specs, decode_group(specs, device, dtype)):
            row = {k: spec[k] for k in ("backend", "batch", "context", "n_heads", "n_kv_heads", "d_model",
                                        "n_layers")}
            row.update(res)
            group.append(row)
        ref = next((r for r in group if r["n_kv_heads"] == d.n_heads), None)
        for r in group:
            if ref is not None:
                r["speedup_vs_mha"] = ref["latency_ms"] / r["latency_ms"]
                r["cache_ratio_vs_mha"] = r["cache_bytes"] / ref["cache_bytes"]
        print(f"[decode {i + 1}/{len(groups)}] {backend:<4} B={B:<3} L={L:<5} ms/token by n_kv_heads: "
              + ", ".join(f"{r['n_kv_heads']}: {r['latency_ms']:.2f}" for r in group), flush=True)
        rows += group
        gc.collect()
    return rows


def run_complexity(cfg) -> dict:
    device = resolve_device(cfg.device)
    _validate_common(cfg)
    sections = list(cfg.sections)
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"sections: unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    out, info = _start(cfg, "complexity", device)
    result = {"subcommand": "complexity", "machine": info, "config": _to_container(cfg), "out_dir": str(out)}
    t0 = time.perf_counter()
    if "scaling" in sections:
        result["scaling"] = scaling_section(cfg, device)
    if "equal_cost" in sections:
        result["equal_cost"] = equal_cost_section(cfg, device)
    if "decode" in sections:
        result["decode"] = decode_section(cfg, device)
    result["wall_s"] = time.perf_counter() - t0
    info["loadavg_end"] = _loadavg()
    if result.get("scaling"):
        result["fits"] = scaling_fits(result["scaling"], cfg.fit_min_n)
    report = complexity_report(result)
    print(report, flush=True)
    _write(out, result, report, [("scaling", result.get("scaling")), ("equal_cost", result.get("equal_cost")),
                                 ("decode", result.get("decode"))])
    if cfg.plots:
        result["plots"] = complexity_plots(result, out)
    return result


# ----------------------------------------------------------------------------------------------------------------
# train: mhalab encoder vs torch.nn.TransformerEncoder


class MhalabLM(nn.Module):
    """mhalab Encoder (embeddings, learned positions, pre-LN blocks, final norm) + a token-level linear head."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.encoder = Encoder(cfg)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size)

    def forward(self, ids, need_weights: bool = False):
        out = self.encoder(ids, need_weights=need_weights)
        return self.head(out.hidden), out.attentions


class TorchLM(nn.Module):
    """The same model with torch.nn.TransformerEncoder: embeddings, learned positions, dropout, n_layers of
    TransformerEncoderLayer(norm_first=True, batch_first=True, GELU), final LayerNorm, token-level linear head.

    To compute exactly what mhalab computes, attention-weight dropout is set to `attn_dropout` and the dropout
    between GELU and the second feed-forward linear (which mhalab's FeedForward does not have) is an Identity.
    """

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        d = cfg.d_model
        self.tok_emb = nn.Embedding(cfg.vocab_size, d)
        self.pos_emb = nn.Embedding(cfg.max_len, d)
        self.drop = nn.Dropout(cfg.dropout)
        layer = nn.TransformerEncoderLayer(d, cfg.n_heads, cfg.d_ff, cfg.dropout, activation="gelu",
                                           batch_first=True, norm_first=True, bias=cfg.bias)
        self.encoder = nn.TransformerEncoder(layer, cfg.n_layers, norm=nn.LayerNorm(d), enable_nested_tensor=False)
        for lay in self.encoder.layers:
            lay.self_attn.dropout = cfg.attn_dropout
            lay.dropout = nn.Identity()
        self.head = nn.Linear(d, cfg.vocab_size)

    def forward(self, ids):
        T = ids.shape[1]
        x = self.drop(self.tok_emb(ids) + self.pos_emb(torch.arange(T, device=ids.device)))
        return self.head(self.encoder(x)), None


def model_train_flops(cfg: EncoderConfig, seq_len: int) -> int:
    """Model FLOPs of one training sequence (closed form, mhalab.cost): 3x the forward matmuls (no recompute)."""
    fwd = cfg.n_layers * (attention_flops(seq_len, cfg.d_model, cfg.n_heads, cfg.d_head, cfg.n_kv_heads)["total"]
                          + feedforward_flops(seq_len, cfg.d_model, cfg.d_ff))
    fwd += 2 * seq_len * cfg.d_model * cfg.vocab_size  # head
    return 3 * fwd


def _train_pair(cfg, n_heads: int, device: torch.device) -> dict:
    mcfg = EncoderConfig(vocab_size=cfg.vocab_size, max_len=cfg.seq_len, d_model=cfg.d_model, n_layers=cfg.n_layers,
                         n_heads=n_heads, d_ff=cfg.d_ff, dropout=cfg.dropout, attn_dropout=cfg.attn_dropout,
                         norm="pre", pos="learned", backend=cfg.backend)
    torch.manual_seed(cfg.seed)
    models = {"mhalab": MhalabLM(mcfg).to(device), BASELINE: TorchLM(mcfg).to(device)}
    n_params = {k: sum(p.numel() for p in m.parameters()) for k, m in models.items()}
    if n_params["mhalab"] != n_params[BASELINE]:
        raise RuntimeError(f"the two models differ in size: {n_params}")
    opts = {k: torch.optim.AdamW(m.parameters(), lr=cfg.lr, weight_decay=0.01) for k, m in models.items()}
    run = {k: (torch.compile(m) if cfg.compile else m) for k, m in models.items()}
    g = torch.Generator().manual_seed(cfg.seed)
    ids = torch.randint(0, cfg.vocab_size, (cfg.batch, cfg.seq_len), generator=g).to(device)
    targets = torch.randint(0, cfg.vocab_size, (cfg.batch, cfg.seq_len), generator=g).to(device)
    probe = torch.randint(0, cfg.vocab_size, (cfg.stats.probe_size, cfg.seq_len), generator=g).to(device)
    amp = cfg.amp_bf16 and device.type == "cuda"

    def step(name: str) -> None:
        model, opt = run[name], opts[name]
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits, _ = model(ids)  # (B, T, V)
        loss = F.cross_entropy(logits.float().reshape(-1, cfg.vocab_size), targets.reshape(-1))
        loss.backward()
        opt.step()

    def stats_pass() -> None:
        """What the training callback does every `stats.every_n_steps`: a no-grad forward with attention weights
        on the probe batch, then head_stats for each layer."""
        m = models["mhalab"]
        m.eval()
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            _, attentions = m(probe, need_weights=True)
            for w in attentions:
                head_stats(w)
        m.train()

    for m in models.values():
        m.train()
    for _ in range(cfg.warmup_steps):
        for name in models:
            step(name)
    stats_pass()
    sync(device)
    per_step = {name: [] for name in models}
    stats_times = []
    for r in range(cfg.rounds):
        order = list(models) if r % 2 == 0 else list(models)[::-1]  # alternate who goes first
        for name in order:
            sync(device)
            t = time.perf_counter()
            for _ in range(cfg.steps_per_round):
                step(name)
            sync(device)
            per_step[name].append((time.perf_counter() - t) / cfg.steps_per_round)
        sync(device)
        t = time.perf_counter()
        stats_pass()
        sync(device)
        stats_times.append(time.perf_counter() - t)
    tokens = cfg.batch * cfg.seq_len
    flops_step = cfg.batch * model_train_flops(mcfg, cfg.seq_len)
    step_s = {name: median(ts) for name, ts in per_step.items()}
    stats_s = median(stats_times)
    every = cfg.stats.every_n_steps
    step_s["mhalab+stats"] = step_s["mhalab"] + (stats_s / every if every else 0.0)
    return {"n_heads": n_heads, "params": n_params["mhalab"], "tokens_per_step": tokens, "flops_per_step": flops_step,
            "step_s": step_s, "stats_pass_s": stats_s, "samples_s": per_step, "stats_samples_s": stats_times}


def run_train(cfg) -> dict:
    device = resolve_device(cfg.device)
    if cfg.backend not in BACKENDS:
        raise ConfigError(f"backend={cfg.backend!r}: must be one of {', '.join(BACKENDS)}")
    for key in ("rounds", "steps_per_round", "batch", "seq_len"):
        if int(cfg[key]) < 1:
            raise ConfigError(f"{key}={cfg[key]!r}: must be a positive integer")
    out, info = _start(cfg, "train", device)
    amp = cfg.amp_bf16 and device.type == "cuda"
    peak = measure_peak_flops(device, torch.bfloat16 if amp else torch.float32, cfg.peak_matmul_size)
    info["peak_matmul_tflops_measured"] = peak / 1e12
    result = {"subcommand": "train", "machine": info, "config": _to_container(cfg), "out_dir": str(out),
              "baseline": BASELINE, "rows": []}
    t0 = time.perf_counter()
    for h in cfg.n_heads:
        pair = _train_pair(cfg, h, device)
        base_s = pair["step_s"][BASELINE]
        for name in ("mhalab", "mhalab+stats", BASELINE):
            s = pair["step_s"][name]
            achieved = pair["flops_per_step"] / s
            result["rows"].append({
                "n_heads": h, "model": name, "step_ms": 1e3 * s, "tokens_per_s": pair["tokens_per_step"] / s,
                "ratio_vs_baseline": base_s / s, "achieved_tflops": achieved / 1e12, "mfu": achieved / peak,
                "params": pair["params"], "stats_every_n_steps": cfg.stats.every_n_steps if name == "mhalab+stats"
                else None})
        result.setdefault("pairs", []).append(pair)
        print(f"n_heads={h}: mhalab {1e3 * pair['step_s']['mhalab']:.1f} ms/step, +stats "
              f"{1e3 * pair['step_s']['mhalab+stats']:.1f} ms/step (stats pass {1e3 * pair['stats_pass_s']:.0f} ms "
              f"every {cfg.stats.every_n_steps} steps), {BASELINE} {1e3 * base_s:.1f} ms/step", flush=True)
    result["wall_s"] = time.perf_counter() - t0
    info["loadavg_end"] = _loadavg()
    report = train_report(result)
    print(report, flush=True)
    _write(out, result, report, [("train", result["rows"])])
    if cfg.plots:
        result["plots"] = train_plots(result, out)
    return result


# ----------------------------------------------------------------------------------------------------------------
# reports and files


def md_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """Markdown table; columns are (key, header, format spec)."""
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

    lines = ["| " + " | ".join(h for _, h, _ in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r, k, f) for k, _, f in columns) + " |" for r in rows]
    return "\n".join(lines)


def complexity_report(result: dict) -> str:
    m = result["machine"]
    parts = [f"# mhalab.bench complexity\n\nmachine: {m.get('gpu') or m['cpu']}, {m['cpu_count']} CPUs, "
             f"torch {m['torch']} ({m['torch_threads']} threads), device {m['device']}; "
             f"load average {m.get('loadavg_start')} at start, {m.get('loadavg_end')} at end; "
             f"memory={result['config']['memory']}; times are medians over {result['config']['repeats']} rounds "
             f"that time every case of a section once, interleaved"]
    if result.get("scaling"):
        parts.append("## Scaling with n (one attention layer)\n\n" + md_table(result["scaling"], [
            ("backend", "backend", ""), ("n", "n", "d"), ("d_model", "d_model", "d"), ("n_heads", "heads", "d"),
            ("d_head", "d_head", "d"), ("n_kv_heads", "kv", "d"), ("batch", "B", "d"),
            ("flops_fwd_closed", "FLOPs fwd (closed)", ".4g"), ("flops_match", "counted = closed", ""),
            ("flops_fwdbwd_match", "fwd+bwd counted = closed", ""), ("fwd_ms", "fwd ms", ".3f"),
            ("fwdbwd_ms", "fwd+bwd ms", ".3f"), ("mem_fwd_mib", "peak fwd MiB", ".1f"),
            ("mem_fwdbwd_mib", "peak fwd+bwd MiB", ".1f"), ("scores_mib", "one n x n score MiB", ".1f")]))
        fit_rows = []
        for f in result["fits"]:
            fit_rows.append({"backend": f["backend"], "shape": f"d={f['d_model']} h={f['n_heads']} "
                             f"dh={f['d_head']} kv={f['n_kv_heads']} B={f['batch']}", "metric": f["label"],
                             "fit": format_fit(f["fit"]) if f["fit"] else "",
                             "fit_all": format_fit(f["fit_all"]) if f["fit_all"] else "",
                             "local": ", ".join(f"{s:.2f}" for _, _, s in f["local"])})
        parts.append("## Fitted exponents (y ~ c n^b, least squares on log-log)\n\n" + md_table(fit_rows, [
            ("backend", "backend", ""), ("shape", "shape", ""), ("metric", "metric", ""),
            ("fit", "b over the fit range", ""), ("fit_all", "b over all n", ""),
            ("local", "local slopes between consecutive n", "")]))
    if result.get("equal_cost"):
        parts.append("## Equal cost: fixed n_heads x d_head\n\n" + md_table(result["equal_cost"], [
            ("backend", "backend", ""), ("n", "n", "d"), ("n_heads", "heads", "d"), ("d_head", "d_head", "d"),
            ("flops_fwd_counted", "FLOPs fwd (counted)", ".4g"), ("flops_equal_to_ref", "= 1 head", ""),
            ("fwd_ms", "fwd ms", ".2f"), ("fwd_ms_ratio", "fwd / 1 head", ".2f"), ("fwdbwd_ms", "fwd+bwd ms", ".2f"),
            ("fwdbwd_ms_ratio", "fwd+bwd / 1 head", ".2f"), ("mem_fwdbwd_mib", "peak fwd+bwd MiB", ".1f"),
            ("mem_fwdbwd_mib_ratio", "mem / 1 head", ".2f"), ("scores_mib", "one score tensor MiB", ".1f")]))
    if result.get("decode"):
        parts.append("## Incremental decoding with a KV cache (per-token latency, median)\n\n" + md_table(
            result["decode"], [
                ("backend", "backend", ""), ("batch", "B", "d"), ("context", "context", "d"),
                ("n_kv_heads", "kv heads", "d"), ("cache_mib", "cache MiB", ".2f"),
                ("cache_ratio_vs_mha", "cache / MHA", ".3f"), ("latency_ms", "ms / token", ".3f"),
                ("speedup_vs_mha", "speed-up vs MHA", ".2f"), ("tokens_per_s", "tokens/s", ".0f"),
                ("implied_gb_per_s", "(cache+weights)/latency GB/s", ".1f"), ("prefill_ms", "prefill ms", ".0f"),
                ("max_abs_diff_vs_full", "max |logit diff| vs full pass", ".1e")]))
        bad = [r for r in result["decode"] if r["cache_bytes"] != r["cache_bytes_closed"]]
        parts.append("cache bytes = mhalab.cost.kv_cache_bytes: " + ("yes, every case" if not bad else
                                                                      f"NO in {len(bad)} case(s)"))
    parts.append(f"wall time {result['wall_s']:.0f} s")
    return "\n\n".join(parts) + "\n"


def train_report(result: dict) -> str:
    m, c = result["machine"], result["config"]
    head = (f"# mhalab.bench train: mhalab encoder vs {BASELINE}\n\nmachine: {m.get('gpu') or m['cpu']}, "
            f"{m['cpu_count']} CPUs, torch {m['torch']} ({m['torch_threads']} threads), device {m['device']}; "
            f"measured matmul peak {m['peak_matmul_tflops_measured'] * 1e3:.1f} GFLOP/s; load average "
            f"{m.get('loadavg_start')} at start, {m.get('loadavg_end')} at end\n"
            f"d_model={c['d_model']} n_layers={c['n_layers']} d_ff={c['d_ff']} seq_len={c['seq_len']} "
            f"batch={c['batch']} vocab={c['vocab_size']} dropout={c['dropout']} attn_dropout={c['attn_dropout']} "
            f"backend={c['backend']} compile={c['compile']} amp_bf16={c['amp_bf16']}; AdamW, cross-entropy; "
            f"median over {c['rounds']} alternating rounds of {c['steps_per_round']} steps; "
            f"mhalab+stats adds the head-statistics pass (probe batch {c['stats']['probe_size']}) "
            f"every {c['stats']['every_n_steps']} steps")
    table = md_table(result["rows"], [
        ("n_heads", "heads", "d"), ("model", "model", ""), ("params", "params", ","), ("step_ms", "ms / step", ".1f"),
        ("tokens_per_s", "tokens/s", ".0f"), ("ratio_vs_baseline", f"ratio vs {BASELINE}", ".3f"),
        ("achieved_tflops", "TFLOP/s", ".4f"), ("mfu", "MFU (vs measured peak)", ".1%")])
    return f"{head}\n\n{table}\n\nwall time {result['wall_s']:.0f} s\n"


def _to_container(cfg) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)


def _out_dir(cfg, sub: str) -> Path:
    out = Path(cfg.out_dir) if cfg.out_dir else Path("outputs/bench") / f"{sub}-{datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=True)
    return out


def _write(out: Path, result: dict, report: str, sections: list[tuple[str, list[dict] | None]]) -> None:
    import pandas as pd

    frames = [pd.DataFrame(rows).assign(section=name) for name, rows in sections if rows]
    if frames:
        df = pd.concat(frames, ignore_index=True)
        df.insert(0, "section", df.pop("section"))
        df.to_csv(out / "results.csv", index=False)
    (out / "results.json").write_text(json.dumps(result, indent=1, default=_json_default))
    (out / "report.md").write_text(report)


def _json_default(o):
    if isinstance(o, (tuple, set)):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _validate_common(cfg) -> None:
    resolve_dtype(cfg.dtype)
    bad = [b for b in cfg.backends if b not in BACKENDS]
    if bad:
        raise ConfigError(f"backends: {bad[0]!r} is not a backend; choose from {', '.join(BACKENDS)}")
    if cfg.memory not in ("rss", "none"):
        raise ConfigError(f"memory={cfg.memory!r}: must be rss (fresh process per case, peak RSS) or none")
    if int(cfg.repeats) < 1 or int(cfg.warmup) < 0:
        raise ConfigError("repeats must be >= 1 and warmup >= 0")
    sdpa_context(cfg.sdpa_kernel)


# ----------------------------------------------------------------------------------------------------------------
# plots (matplotlib Figure objects, no pyplot state)


def _save(fig, path: Path) -> str:
    fig.savefig(path, dpi=90)
    return str(path)


def complexity_plots(result: dict, out: Path) -> list[str]:
    
    paths = []
    if result.get("scaling"):
        fits = {(f["backend"], f["d_model"], f["n_heads"], f["d_head"], f["n_kv_heads"], f["batch"], f["metric"]): f
                for f in result["fits"]}
        groups: dict[tuple, list[dict]] = {}
        for r in result["scaling"]:
            groups.setdefault(_group_key(r), []).append(r)
        for name, metrics, unit in (("scaling_time.png", ("fwd_ms", "fwdbwd_ms"), "ms"),
                                    ("scaling_memory.png", ("mem_fwd_mib", "mem_fwdbwd_mib"), "MiB")):
            if not any(metrics[0] in r for r in result["scaling"]):
                continue
            fig = new_figure(figsize=(11, 4.5), layout="constrained")
            axes = fig.subplots(1, 2)
            for ax, metric in zip(axes, metrics):
                for key, rows in groups.items():
                    pts = [(r["n"], r[metric]) for r in rows if r.get(metric, 0) > 0]
                    if not pts:
                        continue
                    label = key[0] if len(groups) <= len(result["config"]["backends"]) else \
                        f"{key[0]} d={key[1]} h={key[2]} dh={key[3]} kv={key[4]} B={key[5]}"
                    line, = ax.plot(*zip(*pts), "o", label=label)
                    f = fits.get(key + (metric,))
                    fit = f and (f["fit"] or f["fit_all"])
                    if fit:
                        xs = [fit["x_min"], fit["x_max"]]
                        ax.plot(xs, [fit["prefactor"] * x ** fit["exponent"] for x in xs], "-",
                                color=line.get_color(), label=f"{label} fit: n^{fit['exponent']:.2f}")
                    if unit == "ms":  # time proportional to the closed-form FLOPs, pinned at the largest n
                        ref = max(rows, key=lambda r: r["n"])
                        flops = [(r["n"], r["flops_fwd_closed"] * ref[metric] / ref["flops_fwd_closed"]) for r in rows]
                        ax.plot(*zip(*sorted(flops)), ":", color=line.get_color(), lw=1,
                                label=f"{label}: time if proportional to FLOPs")
                ax.set_xscale("log", base=2)
                ax.set_yscale("log")
                ax.set_xlabel("sequence length n")
                ax.set_ylabel(f"{'peak memory growth' if unit == 'MiB' else 'median time'} ({unit})")
                ax.set_title(dict(SCALING_METRICS)[metric])
                ax.grid(True, which="both", alpha=0.3)
                ax.legend(fontsize=8)
            paths.append(_save(fig, out / name))
    if result.get("equal_cost"):
        rows = result["equal_cost"]
        metrics = [m for m in ("fwd_ms_ratio", "fwdbwd_ms_ratio", "mem_fwdbwd_mib_ratio") if any(m in r for r in rows)]
        fig = new_figure(figsize=(4.5 * len(metrics), 4.2), layout="constrained")
        axes = fig.subplots(1, len(metrics), squeeze=False)[0]
        titles = {"fwd_ms_ratio": "forward time", "fwdbwd_ms_ratio": "forward+backward time",
                  "mem_fwdbwd_mib_ratio": "peak memory (fwd+bwd)"}
        for ax, metric in zip(axes, metrics):
            for backend, n in sorted({(r["backend"], r["n"]) for r in rows}):
                pts = sorted((r["n_heads"], r[metric]) for r in rows
                             if r["backend"] == backend and r["n"] == n and metric in r)
                if pts:
                    ax.plot(*zip(*pts), "o-", label=f"{backend} n={n}")
            ax.axhline(1.0, color="k", lw=0.8, ls="--")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log", base=2)
            ax.set_xlabel(f"n_heads (n_heads x d_head = {rows[0]['d_model']})")
            ax.set_ylabel("ratio to 1 head")
            ax.set_title(titles[metric] + ", equal FLOPs")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        paths.append(_save(fig, out / "equal_cost.png"))
    if result.get("decode"):
        rows = result["decode"]
        backends = sorted({r["backend"] for r in rows})
        fig = new_figure(figsize=(5 * len(backends) + 1, 8), layout="constrained")
        axes = fig.subplots(2, len(backends), squeeze=False)
        for j, backend in enumerate(backends):
            for B, L in sorted({(r["batch"], r["context"]) for r in rows if r["backend"] == backend}):
                sel = sorted((r for r in rows if (r["backend"], r["batch"], r["context"]) == (backend, B, L)),
                             key=lambda r: r["n_kv_heads"])
                axes[0, j].plot([r["n_kv_heads"] for r in sel], [r["latency_ms"] for r in sel], "o-",
                                label=f"B={B} L={L}")
                axes[1, j].plot([r["n_kv_heads"] for r in sel], [r["cache_mib"] for r in sel], "o-",
                                label=f"B={B} L={L}")
            for i, ylabel in enumerate(("ms per token (median)", "KV cache MiB (all layers)")):
                ax = axes[i, j]
                ax.set_xscale("log", base=2)
                ax.set_yscale("log")
                ax.invert_xaxis()  # MHA on the left, MQA on the right
                ax.set_xlabel("n_kv_heads (n_heads = MHA ... 1 = MQA)")
                ax.set_ylabel(ylabel)
                ax.set_title(f"decode, backend={backend}")
                ax.grid(True, which="both", alpha=0.3)
                ax.legend(fontsize=7)
        paths.append(_save(fig, out / "decode.png"))
    return paths


def train_plots(result: dict, out: Path) -> list[str]:
    
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


USAGE = """usage: python -m mhalab.bench {complexity,train} [key=value ...]

  complexity  attention cost vs n, equal-cost heads, KV-cache decoding   (conf/bench/complexity.yaml)
  train       training throughput, mhalab vs torch.nn.TransformerEncoder (conf/bench/train.yaml)

examples:
  python -m mhalab.bench complexity grid.n=[64,128,256] backends=[math] sections=[scaling]
  python -m mhalab.bench train n_heads=[4,8] rounds=7 out_dir=outputs/bench/train
  python -m mhalab.bench complexity --cfg    # print the composed config and exit"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    sub, overrides = argv[0], argv[1:]
    if sub not in SUBCOMMANDS:
        print(f"error: unknown subcommand {sub!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    try:
        show = "--cfg" in overrides
        cfg = load_config(sub, [o for o in overrides if o != "--cfg"])
        if show:
            from omegaconf import OmegaConf

            print(OmegaConf.to_yaml(cfg))
            return 0
        (run_complexity if sub == "complexity" else run_train)(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
