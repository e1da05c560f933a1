"""Pilot cost of the issue-27 designs: CPU seconds per training step, one torch thread, as the slope between two
run lengths of the same config (start-up and one final validation cancel), plus each run's start-up CPU (the
intercept: imports, and data preparation when the scratch folder's cache does not hold the task yet). Child CPU time
counts what the run computed whatever else the machine runs; wall time on a shared machine does not.

    cd <scratch folder> && python scripts/measure_step_cost.py [case ...]   # writes pilot_<case>.json
"""
import glob
import json
import os
import resource
import subprocess
import sys
import time

MH = [sys.executable, "-m", "mhalab", "train"]
MQ = ["setup=mqar_cpu", "attention.n_heads=4", "model.rotary_dim=8", "endpoint.stop_at_threshold=false",
      "test=false", "stats=off"]
CASES = {
  "mqar_s32_dh64": (MQ + ["attention.d_head=64"], 50, 250),
  "mqar_s32_dh8_dffmatch": (MQ + ["experiment=head_dim_sweep", "attention.d_head=8"], 50, 250),
  "mqar_s64_dh64": (MQ + ["attention.d_head=64", "data.mqar.seq_len=64", "data.mqar.n_kv_pairs=8"], 40, 160),
  "mqar_s128_dh64_v128": (MQ + ["attention.d_head=64", "data.mqar.seq_len=128", "data.mqar.vocab_size=128",
                                "data.mqar.n_kv_pairs=32"], 30, 110),
  "lm_d64": (["model.d_model=64", "model.d_ff=256", "stats=off", "test=false", "torch_threads=1"], 20, 80),
  "lm_d128": (["model.d_model=128", "model.d_ff=512", "stats=off", "test=false", "torch_threads=1"], 20, 80),
  "lm_d256": (["model.d_model=256", "model.d_ff=1024", "stats=off", "test=false", "torch_threads=1"], 10, 40),
}
out = {}
for name, (ov, n1, n2) in CASES.items():
    if len(sys.argv) > 1 and name not in sys.argv[1:]:
        continue
    res = []
    for n in (n1, n2):
        task = f"pilot_{name}_{n}"
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.time()
        p = subprocess.run(MH + ov + [f"trainer.max_steps={n}", f"trainer.val_check_interval={n}",
                                      "trainer.max_epochs=null", "trainer.check_val_every_n_epoch=null",
                                      f"task_name={task}"], capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"pilot {task} failed (exit {p.returncode}): {p.stderr[-2000:]}")
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        s = sorted(glob.glob(f"logs/{task}/runs/*/summary.json"))[-1]
        t = json.load(open(s))["timings"]
        res.append({"steps": t["train_steps"], "cpu_s": cpu, "fit_s": t["fit_s"], "wall_s": time.time() - t0,
                    "rc": p.returncode, "load1": os.getloadavg()[0]})
    a, b = res
    out[name] = {"runs": res, "cpu_s_per_step": (b["cpu_s"] - a["cpu_s"]) / (b["steps"] - a["steps"]),
                 "wall_fit_s_per_step": (b["fit_s"] - a["fit_s"]) / (b["steps"] - a["steps"]),
                 "startup_cpu_s": a["cpu_s"] - a["steps"] * (b["cpu_s"] - a["cpu_s"]) / (b["steps"] - a["steps"])}
    print(name, json.dumps(out[name]), flush=True)
    json.dump(out, open(f"pilot_{name}.json", "w"), indent=1)
