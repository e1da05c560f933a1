#!/bin/bash
# Seed OUT_DIR with the kv_capacity stages finished so far, so that experiments/gpu/design.sh goes on from there on
# another GPU session (the device machine keeps nothing between sessions):
#   experiments/gpu/resume_kv_capacity.sh OUT && DESIGN_S=... experiments/gpu/design.sh kv_capacity OUT 0,2 1,3
# From experiments/kv_capacity: gpu-h100 (stage A of every load; stage B of loads 16 and 32, and MHA's and GQA-2's
# at loads 4 and 8; MQA's cut stage B there is left out), gpu-h200 (the bf16 numerics of loads 16 and 32) and, where
# it is committed, cpu-xeon/load<N> (stage B of loads 4 and 8 run again whole on a CPU, its state.json naming the
# H100 stages it set aside and the CPU its runs ran on). Each finished stage is copied to
# OUT/stratum-<i>/logs/kv_capacity/multiruns/<folder> and named in that stratum's state.json as
# scripts/run_design.py records it. What runs next: each load's bf16 numerics not yet run (loads 4 and 8); where
# cpu-xeon is absent, stage B of loads 4 and 8 first (on an H100 80GB HBM3 MQA's only; on any other GPU every arm
# again with SET_ASIDE=B STRATA='0 1').
set -eu
OUT=${1:?usage: experiments/gpu/resume_kv_capacity.sh OUT_DIR}
python3 - "$OUT" experiments/kv_capacity <<'EOF'
import json, shutil, sys
from pathlib import Path
out, src = Path(sys.argv[1]), Path(sys.argv[2])
ARMS = {"kv4": "attention.n_kv_heads=4", "kv2": "attention.n_kv_heads=2", "kv1": "attention.n_kv_heads=1"}
for i, load in ((0, 4), (1, 8), (2, 16), (3, 32)):
    root = out / f"stratum-{i}" / "logs" / "kv_capacity"
    cpu = src / "cpu-xeon" / f"load{load}"
    cpu_state = json.loads((cpu / "state.json").read_text()) if (cpu / "state.json").is_file() else {}
    cpu_state = cpu_state.get(f"data.mqar.n_kv_pairs={load}", {})  # the runner's state: {stratum: {stage: ...}}
    stages = [("gpu-h100", "A", "A", "A")]  # (folder under src, its stage folder, copied as, state name)
    stages += [("gpu-h100", f"B-{k}", f"B-{k}", f"B {arm}") for k, arm in ARMS.items()]
    stages += [("gpu-h200", f"bf16-{k}", f"bf16-{k}", f"bf16 {arm}") for k, arm in ARMS.items()]
    stages += [("cpu-xeon", f"B-{k}", f"cpu-B-{k}", f"B {arm}") for k, arm in ARMS.items()]
    state = {}
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
