"""Measuring on a shared machine: devices, timers, interleaved rounds, peak memory, the machine's own peak.

Times are CUDA events on a GPU and perf_counter on the CPU. `interleaved` times several functions in rounds, each
round calling every function once (forward order, then reversed), so load from other work on a shared machine falls
on all of them alike instead of on whichever ran during a busy spell; the medians over rounds are reported. On a
small shared CPU use one thread (`threads=1`): with several OpenMP threads a descheduled thread stalls the others at
every barrier and times become meaningless.
"""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import time

import numpy as np
import torch

from mhalab.cost import matmul_flops
from mhalab.errors import ConfigError
from mhalab.runs.summary import cpu_name

MIB = 2.0 ** 20
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """auto (CUDA if there is one), cpu or cuda[:i]; a ConfigError if CUDA is asked for and absent."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={name!r}: CUDA is not available on this machine; use device=cpu or auto")
    return torch.device(name)


def resolve_dtype(name: str) -> torch.dtype:
    return DTYPES[name]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


def interleaved(fns: list, rounds: int, device: torch.device, min_time_s: float = 0.0,
                min_calls: int | list[int] = 1, warmup: int = 0) -> list[list[float]]:
    """Seconds per call of each function, one value per round: after `warmup` untimed calls of each, every round
    calls each function (order reversed on odd rounds) at least min_calls times (one count, or one per function)
    and until min_time_s has passed, and records the mean. Returns one list of `rounds` values per function."""
    min_calls = min_calls if isinstance(min_calls, list) else [min_calls] * len(fns)
    for fn in fns:
        for _ in range(warmup):
            fn()
    sync(device)
    samples: list[list[float]] = [[] for _ in fns]
    for r in range(rounds):
        for i in (range(len(fns)) if r % 2 == 0 else range(len(fns) - 1, -1, -1)):
            calls, elapsed = 0, 0.0
            while calls < min_calls[i] or elapsed < min_time_s:
                elapsed += time_once(fns[i], device)
                calls += 1
            samples[i].append(elapsed / calls)
    return samples


def median(xs) -> float:
    return float(statistics.median(xs)) if len(xs) else float("nan")


def summary_ms(prefix: str, seconds: list[float]) -> dict[str, float]:
    """{prefix_ms: median, prefix_ms_min, prefix_ms_p25, prefix_ms_p75} in milliseconds."""
    return {f"{prefix}_ms": 1e3 * median(seconds), f"{prefix}_ms_min": 1e3 * min(seconds),
            f"{prefix}_ms_p25": 1e3 * float(np.quantile(seconds, 0.25)),
            f"{prefix}_ms_p75": 1e3 * float(np.quantile(seconds, 0.75))}  # numpy's quantile, as mhalab.report uses


# -- memory ----------------------------------------------------------------------------------------------------

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


def free_memory_bytes(device: torch.device) -> int:
    """Memory a case may take: torch.cuda.mem_get_info's free bytes on CUDA, MemAvailable on the CPU."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 2 ** 30


def size(nbytes: float) -> str:
    """'1.5 GiB', or MiB below one GiB."""
    return f"{nbytes / 2 ** 30:.1f} GiB" if nbytes >= 2 ** 30 else f"{nbytes / 2 ** 20:.1f} MiB"


def out_of_memory(e: BaseException) -> bool:
    """True for an allocation failure (CUDA or CPU), which a benchmark records as a skipped case."""
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


def release(device: torch.device) -> None:
    """Give cached CUDA memory back, so the next case's free memory is what is really free (CPU tensors go when
    their last reference does)."""
    if device.type == "cuda":
        import gc

        gc.collect()
        torch.cuda.empty_cache()


# -- kernels ---------------------------------------------------------------------------------------------------

SDPA_KERNELS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "math": "MATH",
                "cudnn": "CUDNN_ATTENTION"}


def sdpa_context(kernel: str | None):
    """torch.nn.attention.sdpa_kernel restricted to one named kernel, or a no-op for None."""
    if kernel is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(getattr(SDPBackend, SDPA_KERNELS[kernel]))


def sdpa_kernels(fn) -> list[str]:
    """The aten scaled-dot-product kernels one call of fn runs, forward and backward (e.g.
    `_scaled_dot_product_flash_attention`, `_scaled_dot_product_efficient_attention_backward`); [] when attention
    runs as explicit matmuls and softmax (the math backend)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if "scaled_dot_product" in name and name != "_fused_sdp_choice":
                self.names.add(name)
            return func(*args, **(kwargs or {}))

    recorder = Recorder()
    with recorder:
        fn()
    return sorted(recorder.names)


KERNEL_NAMES = {"_scaled_dot_product_flash_attention": "flash", "_scaled_dot_product_flash_attention_for_cpu":
                "flash (cpu)", "_scaled_dot_product_efficient_attention": "efficient",
                "_scaled_dot_product_cudnn_attention": "cudnn",
                "_scaled_dot_product_fused_attention_overrideable": "overrideable"}


def kernel_name(kernels: list[str], backend: str = "sdpa") -> str:
    """A short name for what `sdpa_kernels` found in a layer of `backend`: flash, efficient, cudnn, flash (cpu);
    with no fused kernel, "math (sdpa fallback)" for the sdpa backend (torch's math kernel runs as plain ops) or
    "math (explicit softmax)" for mhalab's math backend."""
    forward = sorted({KERNEL_NAMES.get(k, k) for k in kernels if not k.endswith("backward")})
    if forward:
        return ", ".join(forward)
    return "math (sdpa fallback)" if backend == "sdpa" else "math (explicit softmax)"


# -- the machine -----------------------------------------------------------------------------------------------

def loadavg() -> list[float] | None:
    """1, 5 and 15 minute load averages: how busy the (possibly shared) machine was."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_info(device: torch.device) -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cpu": cpu_name(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "device": str(device)}
    try:
        with open("/proc/meminfo") as f:
            info["memory_gib"] = round(int(f.readline().split()[1]) / 2 ** 20, 1)
    except OSError:
        pass
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["gpu_memory_gib"] = round(torch.cuda.get_device_properties(device).total_memory / 2 ** 30, 1)
    info["loadavg_start"] = loadavg()
    return info


def measure_peak_flops(device: torch.device, dtype: torch.dtype, size: int | None = None, repeats: int = 10) -> float:
    """Measured matmul throughput (FLOP/s) of a size x size GEMM in dtype on random data, best of `repeats` after
    two warm-up calls: the denominator of MFU (the machine's own peak, never a datasheet figure)."""
    size = size or (8192 if device.type == "cuda" else 3072)
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(size, size, generator=g).to(device, dtype)
    b = torch.randn(size, size, generator=g).to(device, dtype)
    times = interleaved([lambda: a @ b], repeats, device, warmup=2)[0]
    return matmul_flops(size, size, size) / min(times)


def memory_limit(cfg, device) -> int:
    """Bytes a case may take: free_fraction of the free memory, and at most max_case_gib if set."""
    limit = int(cfg.free_fraction * free_memory_bytes(device))
    return min(limit, int(cfg.max_case_gib * 2 ** 30)) if cfg.max_case_gib else limit
