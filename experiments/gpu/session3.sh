#!/bin/bash
# The third GPU session in one call (2026-11-26): what the second asked the next to run first.
#   experiments/gpu/session3.sh OUT_DIR                  # on a CUDA machine, about 9 minutes
#   GPU_CHECK_DRY=1 DESIGN_S=60 experiments/gpu/session3.sh OUT_DIR   # the same commands on the CPU, tiny
# 1. `mhalab bench gpu steps='[tests,decode]'`: the GPU tests and the KV-cache decode figures with the named SDPA
#    backends in the code itself (the second session measured the fix only from outside).
# 2. kv_capacity's loads 16 and 32 (strata 2 and 3), where the declared design expects the arms to part: two
#    runners side by side, 8 runs each at a time, stopped after DESIGN_S seconds (finished runs and stages kept).
# A second call goes on where the first stopped: unpack the first call's gpu.tgz into WORK_DIR (/tmp/gpu3, the
# paths the design's state names) and run again with BENCH_S=0.
# Everything but checkpoints is packed into OUT_DIR/gpu.tgz (the device returns at most 8 files).
set -u
OUT=${1:?usage: experiments/gpu/session3.sh OUT_DIR}; W=${WORK_DIR:-/tmp/gpu3}
mkdir -p "$OUT" "$W"
experiments/gpu/machine.sh "$W/machine.txt"
BENCH=(steps='[tests,decode]')
[ "${GPU_CHECK_DRY:-0}" = 1 ] && BENCH+=(dry_run=true)
if [ "${BENCH_S:-130}" != 0 ]; then  # BENCH_S=0: no bench (a second call going on with the design)
  echo "== bench $(date -u +%T)"
  python3 -m mhalab bench gpu out="$W/bench" budget_s="${BENCH_S:-130}" "${BENCH[@]}" > "$W/bench.log" 2>&1
  echo "bench exit $? $(date -u +%T)"; tail -25 "$W/bench.log"
fi
echo "== kv_capacity $(date -u +%T)"
DESIGN_S=${DESIGN_S:-390} experiments/gpu/design.sh kv_capacity "$W/kv_capacity" 2 3 > "$W/design.log" 2>&1
echo "design exit $? $(date -u +%T)"; tail -12 "$W/design.log"
tar czf "$OUT/gpu.tgz" --exclude='*.ckpt' --exclude='checkpoints' --exclude='wandb' --exclude='.cache' -C "$W" .
ls -la "$OUT"
