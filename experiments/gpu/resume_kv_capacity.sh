#!/bin/bash
# Seed OUT_DIR with the kv_capacity stages the GPU sessions finished (experiments/kv_capacity/gpu-h100: loads 4
# and 8, stage A and stage B's MHA and GQA-2 arms; loads 16 and 32, stage A and all of stage B), so that
# experiments/gpu/design.sh goes on from there on another GPU session (the device machine keeps nothing between
# sessions):
#   experiments/gpu/resume_kv_capacity.sh OUT && DESIGN_S=... experiments/gpu/design.sh kv_capacity OUT 0,2 1,3
# Each finished stage is copied to OUT/stratum-<i>/logs/kv_capacity/multiruns/<stage> and named in that stratum's
# state.json as scripts/run_design.py records it; MQA's cut stage B at loads 4 and 8 is left out, so it runs again
# whole. What runs next: that stage B (on an H100 80GB HBM3: scripts/run_design.py refuses a numerics' stage on
# another GPU than its first runs'; on any other GPU, stage B of loads 4 and 8 runs again whole, every arm, with
# SET_ASIDE=B STRATA='0 1', the H100's runs kept as set-aside stages), then every load's bf16 numerics.
set -eu
OUT=${1:?usage: experiments/gpu/resume_kv_capacity.sh OUT_DIR}
SRC=experiments/kv_capacity/gpu-h100
python3 - "$OUT" "$SRC" <<'EOF'
import json, shutil, sys
from pathlib import Path
out, src = Path(sys.argv[1]), Path(sys.argv[2])
STAGES = {"A": "A", "B-kv4": "B attention.n_kv_heads=4", "B-kv2": "B attention.n_kv_heads=2",
          "B-kv1": "B attention.n_kv_heads=1"}
for i, load in ((0, 4), (1, 8), (2, 16), (3, 32)):
    root = out / f"stratum-{i}" / "logs" / "kv_capacity"
    state = {}
    for folder, name in STAGES.items():
        if not (src / f"load{load}" / folder).is_dir():
            continue
        dest = root / "multiruns" / folder
        shutil.copytree(src / f"load{load}" / folder, dest, dirs_exist_ok=True)
        state[name] = {"started": True, "dir": str(dest.resolve())}
    (root / "design").mkdir(parents=True, exist_ok=True)
    (root / "design" / "state.json").write_text(json.dumps({f"data.mqar.n_kv_pairs={load}": state}, indent=1))
    print(f"stratum {i} (load {load}): {', '.join(state)} seeded under {root}")
EOF
