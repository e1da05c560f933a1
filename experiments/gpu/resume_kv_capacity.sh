#!/bin/bash
# Seed OUT_DIR with the kv_capacity stages finished so far, so that experiments/gpu/design.sh goes on from there on
# another GPU session (the device machine keeps nothing between sessions):
#   experiments/gpu/resume_kv_capacity.sh OUT && DESIGN_S=... experiments/gpu/design.sh kv_capacity OUT 0,2 1,3
# From experiments/kv_capacity: gpu-h100 (stage A of every load; stage B of loads 16 and 32, and MHA's and GQA-2's
# at loads 4 and 8; MQA's cut stage B there is left out), gpu-h200 (the bf16 numerics of loads 16 and 32) and, where
# they are committed, the CPU folders cpu-<kind>/load<N> in CPUS' order (stage B of loads 4 and 8 run again whole on
# a CPU, and a CPU's second numerics, avx2 or threads2), each load's later state.json naming the stages it set aside,
# the numerics it ran and the machine each stage ran on. Each finished stage is copied to
# OUT/stratum-<i>/logs/kv_capacity/multiruns/<folder> and named in that stratum's state.json as
# scripts/run_design.py records it. What runs next: each load's numerics not yet run (since 2026-12-05 the bf16
# numerics of loads 4 and 8, on a GPU; every other stage of the design is done).
set -eu
OUT=${1:?usage: experiments/gpu/resume_kv_capacity.sh OUT_DIR}
python3 - "$OUT" experiments/kv_capacity <<'EOF'
import json, shutil, sys
from pathlib import Path
out, src = Path(sys.argv[1]), Path(sys.argv[2])
ARMS = {"kv4": "attention.n_kv_heads=4", "kv2": "attention.n_kv_heads=2", "kv1": "attention.n_kv_heads=1"}
CPUS = ("cpu-xeon", "cpu-epyc")  # in the order they ran: a later CPU's state.json holds the earlier one's stages
for i, load in ((0, 4), (1, 8), (2, 16), (3, 32)):
    root = out / f"stratum-{i}" / "logs" / "kv_capacity"
    cpu_state = {}
    for cpu in CPUS:  # the runner's state: {stratum: {stage: ...}}; the latest CPU's names every earlier stage
        f = src / cpu / f"load{load}" / "state.json"
        if f.is_file():
            cpu_state = json.loads(f.read_text()).get(f"data.mqar.n_kv_pairs={load}", {})
    stages = [("gpu-h100", "A", "A", "A")]  # (folder under src, its stage folder, copied as, state name)
    stages += [("gpu-h100", f"B-{k}", f"B-{k}", f"B {arm}") for k, arm in ARMS.items()]
    stages += [("gpu-h200", f"bf16-{k}", f"bf16-{k}", f"bf16 {arm}") for k, arm in ARMS.items()]
    stages += [(cpu, f"{n}-{k}", f"cpu-{n}-{k}", f"{n} {arm}") for cpu in CPUS for n in ("B", "avx2", "threads2")
               for k, arm in ARMS.items()]
    state = {"numerics": cpu_state["numerics"]} if cpu_state.get("numerics") else {}
    for where, folder, copy, name in stages:
        stage = src / where / f"load{load}" / folder
        if not stage.is_dir():
            continue
        dest = root / "multiruns" / copy
        shutil.copytree(stage, dest, dirs_exist_ok=True)
        entry = {"started": True, "dir": str(dest.resolve())}
        if where == "gpu-h100" and f"set-aside {name}" in cpu_state:  # the CPU ran this stage again whole
            name = f"set-aside {name}"
        entry.update({k: cpu_state[name][k] for k in ("ran_on", "set_aside_on", "machine")
                      if k in cpu_state.get(name, {})})
        state[name] = entry
    (root / "design").mkdir(parents=True, exist_ok=True)
    (root / "design" / "state.json").write_text(json.dumps({f"data.mqar.n_kv_pairs={load}": state}, indent=1))
    print(f"stratum {i} (load {load}): {', '.join(state)} seeded under {root}")
EOF
