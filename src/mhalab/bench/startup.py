"""`mhalab bench startup`: what a run costs beyond its imports, and a short sweep against one plain process.

A tiny 1-step MQAR run (`mhalab train`, preflight, data, one step, validation, test, summary) against the baseline
`python -c "import torch, lightning"`, each a fresh process, in rounds that rotate the order (each command first,
second and third in turn) so load on a shared machine falls on all alike. Reports wall and CPU seconds per round
and the median of the per-round ratios run / baseline. In a sweep the launcher's workers import once, so
everything beyond the imports is paid again by every job.

`mhalab` freezes its objects before the interpreter exits (`mhalab.cli.quick_exit`), which saves the plain
baseline's last garbage collections (about 0.8 s); a second baseline with the same freeze (FROZEN_CODE) shows
the work beyond the imports on equal terms: it is the baseline the goal is judged against.

Then (`sweep_rounds` > 0) a sweep of `sweep_runs` runs of `sweep_steps` steps against the same runs in one plain
PyTorch process (`mhalab.bench.sweep`).
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mhalab.bench.output import md_table, start, write
from mhalab.bench.sweep import time_sweep
from mhalab.bench.timing import loadavg
from mhalab.bench.config import StartupConfig

BASELINE_CODE = "import torch, lightning"
FROZEN_CODE = "import gc, torch, lightning; gc.freeze()"  # the same quick exit as mhalab's
BASELINE, FROZEN = (f'python -c "{code}"' for code in (BASELINE_CODE, FROZEN_CODE))
COLUMNS = [("round", "round", "d"), ("baseline_s", "baseline wall s", ".2f"), ("run_s", "run wall s", ".2f"),
           ("ratio", "run / baseline (wall)", ".3f"), ("baseline_cpu_s", "baseline CPU s", ".2f"),
           ("run_cpu_s", "run CPU s", ".2f"), ("cpu_ratio", "run / baseline (CPU)", ".3f"),
           ("frozen_s", "frozen baseline wall s", ".2f"), ("frozen_ratio", "run / frozen baseline (wall)", ".3f")]
SWEEP_COLUMNS = [("round", "round", "d"), ("sweep_s", "sweep wall s", ".1f"), ("plain_s", "plain process wall s", ".1f"),
                 ("ratio", "sweep / plain", ".3f"), ("sweep_cpu_s", "sweep CPU s", ".1f"),
                 ("plain_cpu_s", "plain process CPU s", ".1f"), ("cpu_ratio", "sweep / plain (CPU)", ".3f")]


def timed(cmd: list[str], env: dict) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one child process; a failure is an error naming the command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {r.returncode}): {r.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run_startup(cfg: StartupConfig) -> dict:
    import torch

    out, info = start(cfg, "startup", torch.device("cpu"))
    threads = [f"torch_threads={cfg.threads}"] if cfg.threads else []
    with tempfile.TemporaryDirectory() as root:
        env = {**os.environ, "WANDB_SILENT": "true", "MHALAB_ROOT": root}
        commands = [("baseline", [sys.executable, "-c", BASELINE_CODE]),
                    ("run", [sys.executable, "-m", "mhalab", "train", *cfg.run_overrides, *threads,
                             f"data.cache_dir={Path(root) / 'cache'}"]),
                    ("frozen", [sys.executable, "-c", FROZEN_CODE])]
        timed(commands[1][1], env)  # warm-up: fills the data cache and the OS's file cache, as a sweep's first job
        rows = []
        for i in range(cfg.rounds):  # each command in each position in turn
            order = commands[i % 3:] + commands[:i % 3]
            got = {name: timed(cmd, env) for name, cmd in order}
            (bw, bc), (rw, rc), (fw, _) = got["baseline"], got["run"], got["frozen"]
            rows.append({"round": i + 1, "baseline_s": bw, "run_s": rw, "ratio": rw / bw, "baseline_cpu_s": bc,
                         "run_cpu_s": rc, "cpu_ratio": rc / bc, "frozen_s": fw, "frozen_ratio": rw / fw})
            print(f"round {i + 1}/{cfg.rounds}: run / baseline {rw / bw:.3f} (wall), {rc / bc:.3f} (CPU); "
                  f"run / frozen baseline {rw / fw:.3f}", flush=True)
        sweep_s = time_sweep_preflight(cfg, env)
        sweep = time_sweep(cfg, env, root) if cfg.sweep_rounds else None
    ratio = statistics.median(r["ratio"] for r in rows)
    cpu_ratio = statistics.median(r["cpu_ratio"] for r in rows)
    frozen_ratio = statistics.median(r["frozen_ratio"] for r in rows)
    info["loadavg_end"] = loadavg()
    result = {"machine": info, "config": {"rounds": cfg.rounds, "run_overrides": cfg.run_overrides,
                                          "goal": cfg.goal, "threads": cfg.threads},
              "rows": rows, "ratio": ratio, "cpu_ratio": cpu_ratio, "frozen_ratio": frozen_ratio,
              "sweep_preflight": {"jobs": cfg.sweep_jobs, "seconds": sweep_s}, "sweep": sweep,
              "within_goal": frozen_ratio <= cfg.goal}
    verdict = "within" if frozen_ratio <= cfg.goal else "OVER"
    report = (f"# mhalab bench startup: a tiny 1-step run against `{BASELINE}`\n\n"
              f"machine: {info['cpu']}, {info['cpu_count']} CPUs, torch {info['torch']}; load average "
              f"{info.get('loadavg_start')} at start, {info['loadavg_end']} at end\n\n"
              f"run: `mhalab train {' '.join(cfg.run_overrides)}`; {cfg.rounds} rounds rotating the order after one "
              f"warm-up run, each a fresh process\n\n{md_table(rows, COLUMNS)}\n\n"
              f"against `{FROZEN}` (the same quick exit as mhalab's: the fair baseline): **{frozen_ratio:.3f}** wall "
              f"({verdict} the goal of {cfg.goal:g}); against `{BASELINE}`: median run / baseline: {ratio:.3f} wall, "
              f"{cpu_ratio:.3f} CPU\n\n"
              f"the preflight of a {cfg.sweep_jobs}-job sweep (`mhalab train -m <run> seed=range({cfg.sweep_jobs})`: "
              f"the master config, each job composed and checked, nothing written): **{sweep_s:.1f} s**, in a "
              f"process of its own from start to the end of the check\n")
    if sweep is not None:
        verdict = "within" if sweep["ratio"] <= cfg.sweep_goal else "OVER"
        report += (f"\na sweep of {sweep['runs']} runs of {sweep['steps']} steps (`{sweep['command']}`, each with its "
                   f"validation and test) against the same runs in one plain PyTorch process "
                   f"(`mhalab.bench.sweep.PLAIN_SWEEP`), {cfg.sweep_rounds} alternating rounds:\n\n"
                   f"{md_table(sweep['rows'], SWEEP_COLUMNS)}\n\n**median sweep / plain: {sweep['ratio']:.3f}** "
                   f"({verdict} the goal of {cfg.sweep_goal:g}); in CPU time: {sweep['cpu_ratio']:.3f}\n")
    write(out, result, report, [("startup", rows), ("sweep", sweep["rows"] if sweep else None)])
    print(report)
    return result


def time_sweep_preflight(cfg, env: dict) -> float:
    """Seconds from just before a fresh process imports mhalab to the end of a `cfg.sweep_jobs`-job sweep's
    preflight (`mhalab.runs.preflight.preflight`, which writes nothing)."""
    check = ("import sys, time; t = time.perf_counter(); from mhalab.runs.preflight import preflight; "
             "preflight(sys.argv[1:]); print(time.perf_counter() - t)")
    argv = ["-m", *cfg.run_overrides, f"seed=range({cfg.sweep_jobs})"]
    r = subprocess.run([sys.executable, "-c", check, *argv], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"the sweep's preflight failed (exit {r.returncode}): {r.stderr[-2000:]}")
    return float(r.stdout.split()[-1])
