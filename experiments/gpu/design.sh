#!/bin/bash
# A declared design of issue 27 on one GPU: stage A and stage B in float32, the second numerics in bf16 mixed
# precision (design.numerics_seeds.bf16), each group of strata by its own runner, the runners side by side.
#   experiments/gpu/design.sh EXPERIMENT OUT_DIR STRATA [STRATA ...]      e.g. kv_capacity /tmp/g 0,2 1,3
#   GPU_CHECK_DRY=1 experiments/gpu/design.sh ...                          the same on the CPU, tiny: checks the script
# Env: JOBS runs at a time per runner (8), DESIGN_S seconds before each runner is stopped (450; what finished is kept:
# a stratum's reports are complete once its runner has written them). Runner r writes OUT_DIR/strata-<r>/logs/...
# (scripts/run_design.py with MHALAB_ROOT there; --no-freeze: the code is the tree this script runs from).
set -u
EXP=${1:?usage: experiments/gpu/design.sh EXPERIMENT OUT_DIR STRATA [STRATA ...]}; OUT=${2:?}; shift 2
JOBS=${JOBS:-8}; DESIGN_S=${DESIGN_S:-450}
if [ "${GPU_CHECK_DRY:-0}" = 1 ]; then  # every run reaches the threshold at its first validation
  TRAINER=(trainer.accelerator=cpu trainer.max_steps=20 trainer.val_check_interval=10 data.mqar.n_train=640
           endpoint.threshold=0.01)
else
  TRAINER=(trainer=gpu trainer.precision=32-true)
fi
mkdir -p "$OUT"
for S in "$@"; do
  R="$OUT/strata-${S//,/-}"
  mkdir -p "$R"
  echo "== $EXP strata $S $(date -u +%T) -> $R"
  MHALAB_ROOT="$R" timeout -s INT "$DESIGN_S" python3 scripts/run_design.py "$EXP" --no-freeze --numerics bf16 \
    --strata "$S" -- "${TRAINER[@]}" torch_threads=1 hydra.launcher.n_jobs="$JOBS" > "$R/design.log" 2>&1 &
done
wait
for S in "$@"; do
  R="$OUT/strata-${S//,/-}"
  echo "== strata $S $(date -u +%T): $(find "$R" -name summary.json | wc -l) runs; reports: $(find "$R" -name report.md | wc -l)"
  tail -3 "$R/design.log"
done
