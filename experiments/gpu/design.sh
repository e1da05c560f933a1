#!/bin/bash
# A declared design of issue 27 on one GPU: stage A and stage B in float32, the second numerics in bf16 mixed
# precision (design.numerics_seeds.bf16), each group of strata by its own runner, the runners side by side.
#   experiments/gpu/design.sh EXPERIMENT OUT_DIR STRATA [STRATA ...]      e.g. kv_capacity /tmp/g 0,2 1,3
#   (a design without design.strata is one stratum: STRATA 0)
#   GPU_CHECK_DRY=1 experiments/gpu/design.sh ...                          the same on the CPU, tiny: checks the script
# Env: JOBS runs at a time per runner (8), DESIGN_S seconds before every runner is stopped (450; what finished is
# kept), SET_ASIDE a numerics whose runs ran on another GPU, run again whole on this one (run_design.py --set-aside:
# e.g. B for kv_capacity loads 4 and 8, whose float32 stage B was cut on an H100; give only those strata).
# Stratum i keeps its state and runs in OUT_DIR/stratum-<i>/logs/... whichever runner runs it (scripts/run_design.py
# with MHALAB_ROOT there; --no-freeze: the code is the tree this script runs from), so the same OUT_DIR given again,
# on the same machine, resumes every stratum where it stopped.
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
export EXP OUT JOBS SET_ASIDE=${SET_ASIDE:-}
RUNNER='for i in ${1//,/ }; do  # the strata of one group, one after another
  mkdir -p "$OUT/stratum-$i"
  echo "== $EXP stratum $i $(date -u +%T)" >> "$OUT/stratum-$i/design.log"
  MHALAB_ROOT="$OUT/stratum-$i" python3 scripts/run_design.py "$EXP" --no-freeze --numerics bf16 --strata "$i" \
    --set-aside "$SET_ASIDE" -- \
    "${@:2}" torch_threads=1 hydra.launcher.n_jobs="$JOBS" >> "$OUT/stratum-$i/design.log" 2>&1 || exit
done'
for S in "$@"; do
  echo "== $EXP strata $S $(date -u +%T)"
  timeout -s INT "$DESIGN_S" bash -c "$RUNNER" runner "$S" "${TRAINER[@]}" &
done
wait
for d in "$OUT"/stratum-*; do
  [ -f "$d/design.log" ] || continue  # a stratum seeded from committed stages that no runner ran here
  echo "== $d $(date -u +%T): $(find "$d" -name summary.json | wc -l) runs; reports: $(find "$d" -name report.md | wc -l)"
  tail -2 "$d/design.log"
done
