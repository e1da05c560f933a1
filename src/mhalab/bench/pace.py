"""`mhalab bench pace`: runs per hour in one command, the three figures of issue 26 against their goals.

It runs `mhalab bench overhead` (a real kv_sweep job's training step against a plain PyTorch loop, with both
fractions of the float32 matmul peak) and `mhalab bench startup` (a 1-step job as a whole process against the
frozen import baseline, and a short sweep against the same runs in one plain process), each into a folder of its
own under `out_dir`, then writes one table: each figure, its baseline, the median of its alternating rounds in wall
and process CPU time, the goal (each bench's own default) and the verdict, judged on wall time.
"""

from __future__ import annotations

import torch

from mhalab.bench.config import OverheadConfig, PaceConfig, StartupConfig
from mhalab.bench.output import md_table, start, write
from mhalab.bench.overhead import run_overhead
from mhalab.bench.startup import FROZEN, run_startup
from mhalab.bench.timing import loadavg

COLUMNS = [("figure", "figure", "s"), ("baseline", "baseline", "s"), ("wall", "median ratio (wall)", ".3f"),
           ("cpu", "median ratio (CPU)", ".3f"), ("goal", "goal", "g"), ("verdict", "verdict", "s"),
           ("detail", "measured beside it", "s")]


def pace_rows(step: dict, job: dict, step_goal: float, job_goal: float, sweep_goal: float,
              sweep_step: dict | None = None) -> list[dict]:
    """One row per figure from the benches' results (`run_overhead` of the step's recipe, `run_startup`, and
    `run_overhead` of the sweep's runs, `sweep_step`); a goal under Lightning's floor (`bare_rounds`) says so."""
    def verdict(ratio, goal, bench=None):
        """Within or over; "under the floor" only when the bare Trainer's ratio, taken against the bench's null
        (plain against plain), still exceeds the goal."""
        if ratio <= goal:
            return "within"
        floor, null = (bench or {}).get("floor_ratio"), (bench or {}).get("null_ratio")
        below = (f"; the goal is under Lightning's own floor ({floor:.3f}, {floor / null:.3f} against the bench's "
                 f"null)" if floor and null and floor / null > goal else "")
        return f"OVER by {ratio - goal:.3f}{below}"

    def floor(bench):
        return ((f"; under a bare Lightning Trainer (`Trainer(barebones=True)`, same model, the floor): "
                 f"{bench['floor_ratio']:.3f}" if bench and "floor_ratio" in bench else "")
                + (f"; a hand loop under Lightning Fabric: {bench['fabric_ratio']:.3f}"
                   if bench and "fabric_ratio" in bench else "")
                + (f"; the bench's null (plain / plain): {bench['null_ratio']:.3f}"
                   if bench and "null_ratio" in bench else ""))

    rows = [{"figure": f"training step, {' '.join(step['config']['recipe'])}", "baseline": "plain PyTorch loop",
             "wall": step["ratio"], "cpu": step["cpu_ratio"], "goal": step_goal,
             "verdict": verdict(step["ratio"], step_goal, step),
             "detail": f"fraction of the matmul peak ({step['peak_gflops']:.0f} GFLOP/s): run {step['run_peak']:.3f}, "
                       f"plain {step['plain_peak']:.3f}{floor(step)}"},
            {"figure": "1-step job, whole process (with its validation and test)", "baseline": FROZEN,
             "wall": job["frozen_ratio"], "cpu": None, "goal": job_goal,
             "verdict": verdict(job["frozen_ratio"], job_goal),
             "detail": f"against the same imports without the freeze: {job['ratio']:.3f}"}]
    sweep = job.get("sweep")
    if sweep:
        rows.append({"figure": f"{sweep['runs']}-job, {sweep['steps']}-step sweep",
                     "baseline": "the same runs in one plain process", "wall": sweep["ratio"],
                     "cpu": sweep["cpu_ratio"], "goal": sweep_goal,
                     "verdict": verdict(sweep["ratio"], sweep_goal, sweep_step),
                     "detail": "each job with its validation and test; the command: startup/report.md"
                               + (f"; its runs' training step against the plain loop: {sweep_step['ratio']:.3f}"
                                  f"{floor(sweep_step)} (sweep_step/report.md)" if sweep_step else "")})
    return rows


def run_pace(cfg: PaceConfig) -> dict:
    out, info = start(cfg, "pace", torch.device("cpu"))
    step_cfg = OverheadConfig(threads=cfg.threads, out_dir=str(out / "overhead"), plots=False, recipe=cfg.recipe,
                              rounds=cfg.step_rounds, steps_per_round=cfg.steps_per_round)
    job_cfg = StartupConfig(threads=cfg.threads, out_dir=str(out / "startup"), plots=False, rounds=cfg.job_rounds,
                            sweep_rounds=cfg.sweep_rounds, sweep_runs=cfg.sweep_runs, sweep_steps=cfg.sweep_steps)
    sweep_step_cfg = OverheadConfig(threads=cfg.threads, out_dir=str(out / "sweep_step"), plots=False,
                                    recipe=[o for o in job_cfg.run_overrides if not o.startswith("trainer.max_steps=")],
                                    rounds=cfg.step_rounds, steps_per_round=cfg.steps_per_round)
    step, job = run_overhead(step_cfg), run_startup(job_cfg)
    sweep_step = run_overhead(sweep_step_cfg) if job.get("sweep") else None
    rows = pace_rows(step, job, step_cfg.goal, job_cfg.goal, job_cfg.sweep_goal, sweep_step)
    info["loadavg_end"] = loadavg()
    result = {"machine": info, "rows": rows, "within_goals": all(r["verdict"] == "within" for r in rows),
              "overhead": str(out / "overhead"), "startup": str(out / "startup"),
              "sweep_step": str(out / "sweep_step") if sweep_step else None}
    report = (f"# mhalab bench pace: runs per hour against plain PyTorch\n\n"
              f"machine: {info['cpu']}, {info['cpu_count']} CPUs, torch {info['torch']}, {cfg.threads or 'all'} "
              f"torch thread(s); load average {info.get('loadavg_start')} at start, {info['loadavg_end']} at end\n\n"
              f"{md_table(rows, COLUMNS)}\n\n"
              f"Each ratio is the median of alternating rounds ({cfg.step_rounds} of the step, {cfg.job_rounds} of "
              f"the job, {cfg.sweep_rounds} of the sweep) measured in this run; the verdict is judged on wall time. "
              f"Every round: `overhead/report.md`, `startup/report.md` and `sweep_step/report.md` beside this file. "
              f"Lightning's floor: the same plain rounds under `Trainer(barebones=True)` training the same model on the "
              f"plain loop's own batches (`mhalab.bench.overhead.BareModule`), what any run the Trainer trains pays; "
              f"a goal under it (taken against the bench's null, a second plain loop against the first) cannot be met "
              f"while the Trainer runs the loop; beside it the same model trained by a hand loop under Lightning "
              f"Fabric (`fabric_rounds`).\n")
    write(out, result, report, [("pace", rows)])
    print(report)
    return result
