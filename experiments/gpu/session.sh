#!/bin/bash
# A GPU session in one call: `mhalab bench gpu`, then strata of a declared design (experiments/gpu/design.sh),
# everything but checkpoints packed into OUT_DIR/gpu.tgz and OUT_DIR/EXP-stratum-<i>.tgz (unpack all into WORK_DIR).
#   experiments/gpu/session.sh OUT_DIR                                  # on a CUDA machine, about 9 minutes
#   GPU_CHECK_DRY=1 DESIGN_S=60 experiments/gpu/session.sh OUT_DIR      # the same commands on the CPU, tiny
# Env (defaults: the third session's call, 2026-11-26):
#   BENCH_STEPS  `mhalab bench gpu` steps ('[tests,decode]'); BENCH_ARGS more of its keys, space-separated
#   BENCH_S      its budget in seconds (130); 0: no bench (a later call going on with the design)
#   EXP, STRATA  the design and its strata, one runner per word ("kv_capacity", "2 3": loads 16 and 32)
#   RESUME       a script run first with WORK_DIR/EXP as its argument, seeding committed stages
#                (e.g. experiments/gpu/resume_kv_capacity.sh); skipped where that folder exists already
#   DESIGN_S     seconds before the design's runners are stopped (390); WORK_DIR (/tmp/gpu3)
#   SET_ASIDE    a numerics of STRATA run again whole on this GPU (experiments/gpu/design.sh; e.g. B)
#   ORDER        the steps in their order ("bench design"; "design bench": the design first)
# A later call on the same machine goes on where the last stopped (the design's state lives in WORK_DIR); on a
# fresh machine, unpack the last call's archives into WORK_DIR first (the paths the design's state names).
set -u
OUT=${1:?usage: experiments/gpu/session.sh OUT_DIR}; W=${WORK_DIR:-/tmp/gpu3}; EXP=${EXP:-kv_capacity}
BENCH_S=${BENCH_S:-130}
mkdir -p "$OUT" "$W"
experiments/gpu/machine.sh "$W/machine.txt"
BENCH=(steps="${BENCH_STEPS:-[tests,decode]}" ${BENCH_ARGS:-})
[ "${GPU_CHECK_DRY:-0}" = 1 ] && BENCH+=(dry_run=true)
bench() {
  [ "$BENCH_S" = 0 ] && return
  echo "== bench $(date -u +%T)"
  python3 -m mhalab bench gpu out="$W/bench" budget_s="$BENCH_S" "${BENCH[@]}" > "$W/bench.log" 2>&1
  echo "bench exit $? $(date -u +%T)"; tail -25 "$W/bench.log"
}
design() {
  if [ -n "${RESUME:-}" ] && [ ! -d "$W/$EXP" ]; then
    "$RESUME" "$W/$EXP" || return
  fi
  echo "== $EXP $(date -u +%T)"
  # shellcheck disable=SC2086  # one runner per word of STRATA
  DESIGN_S=${DESIGN_S:-390} experiments/gpu/design.sh "$EXP" "$W/$EXP" ${STRATA:-2 3} >> "$W/design.log" 2>&1
  echo "design exit $? $(date -u +%T)"; tail -12 "$W/design.log"
}
for step in ${ORDER:-bench design}; do "$step"; done
# one archive of the rest and one per stratum of the design (a returned file holds 16 MiB at most)
SKIP=(--exclude='*.ckpt' --exclude='checkpoints' --exclude='wandb' --exclude='.cache')
tar czf "$OUT/gpu.tgz" "${SKIP[@]}" --exclude="./$EXP" -C "$W" .
for d in "$W/$EXP"/stratum-*; do
  [ -d "$d" ] && tar czf "$OUT/$EXP-${d##*/}.tgz" "${SKIP[@]}" -C "$W" "$EXP/${d##*/}"
done
ls -la "$OUT"
