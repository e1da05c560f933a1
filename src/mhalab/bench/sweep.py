"""A short sweep against the same runs in one plain process (`mhalab bench startup`'s sweep figure).

The sweep is `mhalab train -m <run> trainer.max_steps=<steps> seed=0..n-1 hydra/launcher=basic`: its jobs one after
another in one process, as the plain side runs them, each with its validation and test. The plain side
(PLAIN_SWEEP) is what a plain PyTorch script would do for the same runs: read the same cached data with pyarrow,
and for each seed `build_model` on the run's architecture, AdamW with the run's groups, schedule and clipping,
`steps` steps on batches sliced from an in-memory tensor, then accuracy on validation and test. Both are whole
processes on one thread, timed in alternating rounds; the figure is the median of the per-round ratios, of wall
time and of CPU time (user + system; other work on a loaded machine moves it far less).
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import time

PLAIN_SWEEP = r"""
import json, sys
import torch
spec = json.loads(sys.argv[1])
torch.set_num_threads(1)
from mhalab.architecture import Architecture
from mhalab.data.arrow import load_splits
from mhalab.model import build_model
from mhalab.training.module import lr_lambda
splits = load_splits(spec["folder"])
data = {name: {c: splits[name][c] for c in ("input_ids", "labels")} for name in ("train", "validation", "test")}
arch, o, B, steps = Architecture.from_dict(spec["arch"]), spec["optim"], spec["batch_size"], spec["steps"]
for seed in range(spec["runs"]):
    torch.manual_seed(seed)
    model = build_model(arch)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}], lr=o["lr"], betas=o["betas"], eps=o["eps"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_lambda(s, spec["warmup"], steps, o["min_lr_ratio"]))
    ids, labels = data["train"]["input_ids"], data["train"]["labels"]  # (N, T)
    order = torch.randperm(len(ids), generator=torch.Generator().manual_seed(seed))
    model.train()
    for step in range(steps):
        idx = order[(step * B) % len(ids):][:B]
        logits = model(ids[idx]).logits  # (B, T, V)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels[idx].flatten(), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if spec["clip"]:
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec["clip"])
        opt.step()
        sched.step()
    model.eval()
    with torch.no_grad():
        for split in ("validation", "test"):
            x, y = data[split]["input_ids"], data[split]["labels"]
            correct = sum(int(((model(x[i:i + B]).logits.argmax(-1) == y[i:i + B]) & (y[i:i + B] != -100)).sum())
                          for i in range(0, len(x), B))
"""


def sweep_spec(cfg, env: dict, cache: str) -> dict:
    """What the plain side needs: the data folder, the architecture, optimiser, batch size, steps and clipping of
    the sweep's runs (composed as `mhalab train` composes them)."""
    code = ("import json, sys, dataclasses\n"
            "from mhalab.config.compose import resolved\n"
            "from mhalab.runs.preflight import compose, validate\n"
            "from mhalab.data import build_datamodule, preprocessing\n"
            "cfg = compose(sys.argv[1:]); tc = validate(cfg, resolved(cfg, '/nonexistent'))\n"
            "dm = build_datamodule(tc.data, seed=tc.seed); dm.prepare_data(); dm.setup('fit')\n"
            "arch = tc.architecture(dm.vocab_size, dm.objective, dm.n_classes)\n"
            "total = tc.trainer.max_steps; o = tc.optim\n"
            "warmup = int(o.warmup_ratio * total) if o.warmup_ratio is not None else o.warmup_steps\n"
            "print(json.dumps({'folder': str(dm._checked / 'dataset'), 'arch': arch.to_dict(),\n"
            "                  'optim': dataclasses.asdict(o), 'batch_size': dm.batch_size, 'steps': total,\n"
            "                  'warmup': min(warmup, total), 'clip': tc.trainer.gradient_clip_val}))\n")
    r = subprocess.run([sys.executable, "-c", code, *run_overrides(cfg, cache)], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"composing the sweep's runs failed (exit {r.returncode}): {r.stderr[-2000:]}")
    return {**json.loads(r.stdout.strip().splitlines()[-1]), "runs": cfg.sweep_runs}


def run_overrides(cfg, cache: str) -> list[str]:
    return [o for o in cfg.run_overrides if not o.startswith("trainer.max_steps=")] + [
        f"trainer.max_steps={cfg.sweep_steps}", f"torch_threads={cfg.threads or 1}", f"data.cache_dir={cache}"]


def time_sweep(cfg, env: dict, root: str) -> dict:
    """Per-round wall seconds of the sweep and of the plain process, and the median ratio (data cached in root)."""
    cache = f"{root}/cache"
    spec = sweep_spec(cfg, env, cache)
    seeds = ",".join(str(s) for s in range(cfg.sweep_runs))
    commands = {"sweep": [sys.executable, "-m", "mhalab", "train", "-m", *run_overrides(cfg, cache), f"seed={seeds}",
                          "hydra/launcher=basic"],
                "plain": [sys.executable, "-c", PLAIN_SWEEP, json.dumps(spec)]}
    rows = []
    for i in range(cfg.sweep_rounds):
        order = list(commands) if i % 2 == 0 else list(commands)[::-1]
        got, cpu = {}, {}
        for name in order:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            r = subprocess.run(commands[name], env={**env, "MHALAB_ROOT": f"{root}/sweep{i}"},
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            got[name] = time.perf_counter() - t
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[name] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            if r.returncode != 0:
                raise RuntimeError(f"the {name} side failed (exit {r.returncode}): {r.stderr[-2000:]}")
        rows.append({"round": i + 1, "sweep_s": got["sweep"], "plain_s": got["plain"],
                     "ratio": got["sweep"] / got["plain"], "sweep_cpu_s": cpu["sweep"], "plain_cpu_s": cpu["plain"],
                     "cpu_ratio": cpu["sweep"] / cpu["plain"]})
        print(f"sweep round {i + 1}/{cfg.sweep_rounds}: sweep / plain {rows[-1]['ratio']:.3f} "
              f"(CPU {rows[-1]['cpu_ratio']:.3f})", flush=True)
    return {"runs": cfg.sweep_runs, "steps": cfg.sweep_steps, "rows": rows,
            "ratio": statistics.median(r["ratio"] for r in rows),
            "cpu_ratio": statistics.median(r["cpu_ratio"] for r in rows),
            "command": "mhalab train " + " ".join(commands["sweep"][4:])}
