"""`mhalab bench gpu [out=DIR] [dry_run=true]`: the GPU check, in one command and one folder, in under 10 minutes.

Steps (`steps=[...]` picks some), each recorded in summary.json and report.md, a failure recorded and the rest run:
  tests       `pytest -m gpu tests/bench/test_gpu.py` (sdpa vs math in bf16/fp16, fused kernels selected for MHA/GQA/MQA with
              and without padding, KV cache, statistics and importance against the CPU, a GPU checkpoint read on CPU)
  train       `mhalab train trainer=gpu` of the default task (and data=mqar where that task exists), step-capped,
              each leaving its summary.json
  throughput  `bench train` at each d_model (heads of 64, d_ff 4 d_model) in bf16, eager and torch.compile, against
              torch.nn.TransformerEncoder, MFU against the measured bf16 matmul peak, the statistics pass's share
  complexity  `bench complexity` up to n = max_n, math and sdpa, with fitted exponents, and the equal-cost table
  decode      `bench complexity sections=[decode]`: MQA/GQA against MHA at the configured batches and contexts
and a report (report.md) with the device, the SDPA kernel that training uses, the tables, the plots and the claims.

Every case sizes itself from the free device memory (torch.cuda.mem_get_info) and skips what would not fit, saying
so. Without CUDA the command refuses (exit 2) unless `dry_run=true`, which runs every step on the CPU with tiny
shapes, writes the same folder and a report that says it holds no GPU figure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from datetime import datetime
from pathlib import Path

import torch

from mhalab.bench import output
from mhalab.bench.gpu_report import claim_rows, gpu_report
from mhalab.bench.config import (ComplexityConfig, DecodeConfig, EqualCostConfig, GpuConfig, GridConfig,
                                 ThroughputConfig)
from mhalab.bench.timing import free_memory_bytes, kernel_name, machine_info, release, sdpa_kernels
from mhalab.cost import training_bytes
from mhalab.errors import ConfigError
from mhalab.config.schema import StatsConfig

TINY_TRAIN = ["trainer.accelerator=cpu", "trainer.devices=1", "trainer.precision=32-true", "model.d_model=32",
              "model.n_layers=1", "model.d_ff=64", "attention.n_heads=2", "data.limit=64", "data.max_len=64",
              "data.batch_size=16", "trainer.limit_val_batches=2", "trainer.limit_test_batches=2",
              "trainer.num_sanity_val_steps=0", "stats.every_n_steps=2", "stats.importance_batches=2",
              "stats.plots=false", "optim.warmup_steps=1"]


# the least a step needs; the tests took 30-33 s on an H100 (experiments/gpu), so their step is given at least 60 s
STEP_MIN_S = {"tests": 60, "train": 60, "throughput": 60, "complexity": 90, "decode": 45}


class Budget:
    """The command's wall-time target: steps and cases ask before they start."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def run_gpu(cfg: GpuConfig) -> dict:
    """Every step of cfg.steps into the folder cfg.out, then report.md and summary.json; a ConfigError without
    CUDA unless dry_run."""
    if not cfg.dry_run and not torch.cuda.is_available():
        raise ConfigError("no CUDA device: `mhalab bench gpu` measures a GPU; run it on a CUDA machine, or pass "
                          "dry_run=true to check the command on the CPU (tiny shapes, no GPU figures)")
    device = torch.device("cpu" if cfg.dry_run else "cuda")
    out = Path(cfg.out or f"outputs/bench/gpu-{datetime.now():%Y%m%d-%H%M%S}")
    out.mkdir(parents=True, exist_ok=True)
    budget = Budget(cfg.budget_s)
    info = machine_info(device)
    result = {"dry_run": cfg.dry_run, "device_name": info.get("gpu", "CPU (dry run, no GPU)"), "machine": info,
              "config": output.plain(cfg), "out": str(out), "steps": {}}
    print(f"mhalab bench gpu -> {out}{' (CPU DRY RUN, tiny shapes)' if cfg.dry_run else ''}\nmachine: {info}",
          flush=True)
    result["sdpa_kernels"] = kernel_survey(device, torch.float32 if cfg.dry_run else torch.bfloat16,
                                           d_head=8 if cfg.dry_run else 64, seq_len=16 if cfg.dry_run else 128)
    t0 = time.perf_counter()
    for name, fn in (("tests", _tests), ("train", _train), ("throughput", _throughput), ("complexity", _complexity),
                     ("decode", _decode)):
        need_s = STEP_MIN_S[name]
        if name not in cfg.steps:
            continue
        if budget.left() < (0 if cfg.dry_run else need_s):
            result["steps"][name] = {"status": "skipped", "note": f"skipped: {budget.left():.0f} s of budget_s="
                                     f"{cfg.budget_s:.0f} left, the step needs about {need_s} s at least"}
            continue
        print(f"\n== {name} ({budget.left():.0f} s of the budget left)", flush=True)
        t = time.perf_counter()
        try:
            result["steps"][name] = fn(cfg, out, device, budget)
        except Exception as e:  # noqa: BLE001 - one failing step must not lose the others
            result["steps"][name] = {"status": "failed", "error": f"{type(e).__name__}: {e}",
                                     "traceback": traceback.format_exc()[-4000:]}
        result["steps"][name]["wall_s"] = time.perf_counter() - t
        release(device)
    result["wall_s"] = time.perf_counter() - t0
    result["claims"] = claim_rows(result)
    report = gpu_report(result)
    (out / "report.md").write_text(report)
    (out / "summary.json").write_text(json.dumps(result, indent=1, default=output.json_default))
    print(report, flush=True)
    result["exit_status"] = int(any(s.get("status") == "failed" for s in result["steps"].values()))
    return result


def kernel_survey(device: torch.device, dtype: torch.dtype, d_head: int = 64, seq_len: int = 128) -> list[dict]:
    """Which SDPA kernel one training step's attention runs (forward and backward, 8 heads of d_head) for MHA, GQA
    and MQA, without and with padding: torch's own choice, as training makes it."""
    from mhalab.attention import MultiHeadAttention

    rows = []
    for label, kv in (("MHA", 8), ("GQA", 2), ("MQA", 1)):
        attn = MultiHeadAttention(8 * d_head, 8, kv, d_head).to(device, dtype)
        x = torch.randn(2, seq_len, 8 * d_head, device=device, dtype=dtype, requires_grad=True)  # (B, T, d_model)
        pad = torch.zeros(2, seq_len, dtype=torch.bool, device=device)  # (B, T) True = padding
        pad[1, seq_len * 3 // 4:] = True
        for padded in (False, True):
            kernels = sdpa_kernels(lambda: attn(x, key_padding_mask=pad if padded else None)[0].sum().backward())
            rows.append({"attention": label, "d_head": d_head, "padding": "yes" if padded else "no",
                         "kernel": kernel_name(kernels), "ops": kernels})
    return rows


# -- steps -----------------------------------------------------------------------------------------------------

def _checkout() -> Path | None:
    """The source checkout holding tests/bench/test_gpu.py: the working directory, else the one an editable install
    points into; None for a plain install run elsewhere."""
    for root in (Path.cwd(), Path(__file__).resolve().parents[3]):
        if (root / "tests" / "bench" / "test_gpu.py").is_file():
            return root
    return None


def _tests(cfg, out: Path, device, budget: Budget) -> dict:
    repo = _checkout()
    if repo is None:
        return {"status": "skipped", "note": "tests/bench/test_gpu.py not found: run from a source checkout"}
    test_file = repo / "tests" / "bench" / "test_gpu.py"
    (out / "tests").mkdir(exist_ok=True)
    junit = out / "tests" / "junit.xml"
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", str(test_file), "-q", "-rs", "-p", "no:cacheprovider",
           f"--junitxml={junit}"]
    timeout = max(STEP_MIN_S["tests"], budget.left() / 4)
    proc = _run(cmd, out / "tests" / "pytest.log", repo, dict(os.environ), timeout=timeout)
    proc["log"] = "tests/pytest.log"
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if junit.is_file():
        suite = ET.parse(junit).getroot()
        suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
        counts = {k: int(suite.get(k, 0)) for k in counts}
    failed = proc["returncode"] not in (0, 5) or counts["failures"] or counts["errors"]
    return {"status": "failed" if failed else "ok", "command": " ".join(cmd[1:]), **proc, **counts,
            "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]}


def _run(cmd: list[str], log: Path, cwd: Path, env: dict, timeout: float) -> dict:
    """Run cmd, its output into log; {returncode, log} (returncode 124 on timeout)."""
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            f.write(f"\n[mhalab bench gpu: stopped after {timeout:.0f} s]\n")
            rc = 124
    return {"returncode": rc, "log": str(log)}


def train_tasks(cfg) -> list[str]:
    """The tasks trained: cfg.train_tasks, or the default task and mqar where mhalab knows it."""
    from mhalab.data.config import TASKS, DataConfig

    if cfg.train_tasks is not None:
        return list(cfg.train_tasks)
    return [DataConfig().task] + (["mqar"] if "mqar" in TASKS else [])


def train_command(cfg, task: str) -> list[str]:
    """The `mhalab train` arguments of one task: trainer=gpu (or the CPU for a dry run), capped at train_steps."""
    args = (TINY_TRAIN if cfg.dry_run else ["trainer=gpu"]) + [
        f"trainer.max_steps={3 if cfg.dry_run else cfg.train_steps}", "trainer.max_epochs=-1",
        "trainer.enable_progress_bar=false", "logger=csv", "task_name=gpu_check"]
    return args + [f"data={task}"] + list(cfg.train_overrides)  # each task's own data config, whatever the default


def _train(cfg, out: Path, device, budget: Budget) -> dict:
    runs, tasks = {}, train_tasks(cfg)
    for i, task in enumerate(tasks):
        root = out / "train" / task
        root.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "mhalab.training.train", *train_command(cfg, task)]
        env = {**os.environ, "MHALAB_ROOT": str(root.resolve()), "WANDB_SILENT": "true"}
        env.pop("MHALAB_RUN_ID", None)
        timeout = max(60.0, budget.left() / 3 / (len(tasks) - i))
        rec = {"task": task, "command": "mhalab train " + " ".join(cmd[3:]),
               **_run(cmd, out / "train" / f"{task}.log", Path.cwd(), env, timeout), "log": f"train/{task}.log"}
        found = sorted(root.rglob("summary.json"))
        if found:
            s = json.loads(found[-1].read_text())
            shutil.copy(found[-1], out / "train" / f"{task}-summary.json")
            rec.update(summary=str(found[-1].relative_to(out)), run_status=s.get("status"),
                       metrics=s.get("metrics", {}), test_metrics=s.get("test_metrics", {}),
                       timings=s.get("timings", {}))
        rec["status"] = "ok" if rec["returncode"] == 0 and rec.get("run_status") == "ok" else "failed"
        runs[task] = rec
        print(f"train {task}: {rec['status']} (log {rec['log']})", flush=True)
    return {"status": "ok" if all(r["status"] == "ok" for r in runs.values()) else "failed", "runs": runs}


def throughput_configs(cfg, device) -> list[tuple[str, ThroughputConfig | None, str]]:
    """(label, config or None, note) per d_model x compile, the batch from `fitting_batch`; a size where not even
    batch 1 fits free_fraction of the free memory is None with a note."""
    stats = StatsConfig(every_n_steps=cfg.stats_every_n_steps, probe_size=8 if not cfg.dry_run else 2,
                        importance_batches=2 if cfg.dry_run else 8, plots=False)
    if cfg.dry_run:
        sizes = [dict(d_model=32, n_heads=[2], n_layers=1, d_ff=64, seq_len=16, vocab_size=64, batch=2,
                      peak_matmul_size=128)]
    else:
        sizes = [dict(d_model=d, n_heads=[d // 64], n_layers=cfg.n_layers, d_ff=4 * d, seq_len=cfg.seq_len,
                      vocab_size=1024) for d in cfg.d_models]
    out = []
    for size in sizes:
        dry = cfg.dry_run
        base = dict(device=str(device), threads=1 if dry else None, amp_bf16=True, dropout=0.0, stats=stats,
                    rounds=2 if dry else 5, steps_per_round=1 if dry else 3, warmup_steps=1 if dry else 3, **size)
        if "batch" not in base:
            base["batch"] = fitting_batch(ThroughputConfig(**base, batch=1), cfg, device)
        for compiled in cfg.compile:
            label = f"d{base['d_model']}-{'compiled' if compiled else 'eager'}"
            if base["batch"] is None:
                out.append((label, None, f"d_model={base['d_model']}: not even batch 1 fits in {cfg.free_fraction} "
                                         "of the free memory"))
                continue
            tc = ThroughputConfig(**base, compile=compiled, compile_backend="eager" if cfg.dry_run else "inductor")
            out.append((label, tc, ""))
    return out


def fitting_batch(tc: ThroughputConfig, cfg, device) -> int | None:
    """The largest power of two up to max_batch whose training (`cost.training_bytes`, with a margin of 1.5) fits
    beside the second model's weights and optimizer state (`training_bytes` of no batch); None if 1 does not."""
    arch = tc.architecture(tc.n_heads[0])
    limit = cfg.free_fraction * free_memory_bytes(device) - training_bytes(arch, 0, tc.seq_len)
    batch, b = None, 1
    while b <= cfg.max_batch and 1.5 * training_bytes(arch, b, tc.seq_len, tc.stats.probe_size) <= limit:
        batch, b = b, 2 * b
    return batch


def _throughput(cfg, out: Path, device, budget: Budget) -> dict:
    from mhalab.bench.throughput import run_train

    runs = {}
    later = sum(STEP_MIN_S[s] for s in ("complexity", "decode") if s in cfg.steps)  # kept for the steps after
    for label, tc, note in throughput_configs(cfg, device):
        if tc is None or budget.left() < (0 if cfg.dry_run else 45 + later):
            runs[label] = {"status": "skipped", "note": note or f"skipped: {budget.left():.0f} s of the budget left"}
            print(f"throughput {label}: {runs[label]['note']}", flush=True)
            continue
        tc.out_dir = str(out / "throughput" / label)
        res = run_train(tc)
        runs[label] = {"status": "ok", "out_dir": f"throughput/{label}", "rows": res["rows"], "stats": res["stats"],
                       "d_model": tc.d_model, "d_head": tc.d_model // tc.n_heads[0], "d_ff": tc.d_ff,
                       "n_layers": tc.n_layers, "batch": tc.batch, "seq_len": tc.seq_len, "compile": tc.compile,
                       "peak_tflops": res["machine"]["peak_matmul_tflops_measured"]}
        release(device)
    return {"status": "ok", "runs": runs}


def complexity_config(cfg, device, decode: bool) -> ComplexityConfig:
    """The complexity (or decode) run at GPU sizes, or tiny ones for a dry run."""
    dry = cfg.dry_run
    common = dict(device=str(device), threads=1 if dry else None, dtype="float32" if dry else "bfloat16",
                  repeats=2 if dry else 5, warmup=0 if dry else 2, min_time_s=0.0 if dry else 0.01,
                  memory="none" if dry else "rss", free_fraction=cfg.free_fraction)
    if cfg.dry_run:
        grid = GridConfig(n=[16, 32], d_model=[16], n_heads=[2])
        equal = EqualCostConfig(width=16, n_heads=[1, 2], n=[16])
        dec = DecodeConfig(d_model=16, n_heads=2, d_ff=32, vocab_size=32, batch=[1, 2], context=[8], steps=2,
                           warmup_steps=1, prefill_max_tokens=8, check_max_tokens=8)
        fit_min_n = 16
    else:
        n = [2 ** k for k in range(9, 31) if 2 ** k <= cfg.max_n]
        grid = GridConfig(n=n, d_model=[1024], n_heads=[16])
        equal = EqualCostConfig(width=1024, n_heads=[1, 2, 4, 8, 16, 32], n=[1024, 4096])
        dec = DecodeConfig(d_model=1024, n_heads=16, n_layers=2, d_ff=4096, vocab_size=1024, batch=cfg.decode_batch,
                           context=cfg.decode_context, steps=16, warmup_steps=3, prefill_max_tokens=65536,
                           check_max_tokens=16384)
        fit_min_n = 2048
    sections = ["decode"] if decode else ["scaling", "equal_cost"]
    return ComplexityConfig(**common, sections=sections, grid=grid, equal_cost=equal, decode=dec, fit_min_n=fit_min_n,
                            backends=["math", "sdpa"])


def _complexity(cfg, out: Path, device, budget: Budget, decode: bool = False) -> dict:
    from mhalab.bench.complexity import run_complexity

    cc = complexity_config(cfg, device, decode)
    cc.out_dir = str(out / ("decode" if decode else "complexity"))
    res = run_complexity(cc)
    keep = ("decode",) if decode else ("scaling", "equal_cost", "fits")
    plots = [str(Path(p).relative_to(out)) for p in res.get("plots", [])]
    return {"status": "ok", "out_dir": Path(cc.out_dir).name, "plots": plots, "skipped": res["skipped"],
            **{k: res.get(k) for k in keep}}


def _decode(cfg, out: Path, device, budget: Budget) -> dict:
    return _complexity(cfg, out, device, budget, decode=True)
