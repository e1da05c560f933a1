#!/bin/bash
# conversion_margin (README.md): MHA -> GQA-G conversion of kv_bpb's d_model 128 MHA sources at the three uptraining
# budgets, with the margin declared in README.md before any run. One loop per target; two loops side by side:
#   experiments/conversion_margin/run.sh B 1 & experiments/conversion_margin/run.sh B 2 &
# NUMERICS: B (the default numerics, stage-B sources, seeds 10-17), avx2 (sources 20-27, ATEN_CPU_CAPABILITY=avx2)
# or threads2 (sources 30-37, --threads 2: run one loop at a time). Run from the repository root (logs/ beside it).
# Resumable: a budget whose conversion.json exists is skipped.
set -eu
NUMERICS=${1:?usage: run.sh B|avx2|threads2 N_KV_HEADS}; G=${2:?usage: run.sh B|avx2|threads2 N_KV_HEADS}
M=0.033  # the margin on test/bpb, declared in README.md (commit before the first run)
STRATUM='model.d_model=128 model.d_ff=512 attention.d_head=32 model.param_match.d_head=32'
case $NUMERICS in
  B) STAGE='B attention.n_kv_heads=4'; OUT=results; THREADS=1 ;;
  avx2) STAGE='avx2 attention.n_kv_heads=4'; OUT=results-avx2; THREADS=1; export ATEN_CPU_CAPABILITY=avx2 ;;
  threads2) STAGE='threads2 attention.n_kv_heads=4'; OUT=results-threads2; THREADS=2 ;;
  *) echo "NUMERICS=$NUMERICS: give B, avx2 or threads2" >&2; exit 2 ;;
esac
S=$(python3 -c "import json, sys; print(json.load(open('logs/kv_bpb/design/state.json'))[sys.argv[1]][sys.argv[2]]['dir'])" \
  "$STRATUM" "$STAGE")
# BUDGETS: which budgets, in this order (default: the dearest first: 0.10 carries the from-scratch run of the same
# total steps); e.g. BUDGETS="0.05 0.01" for what fits a session (a budget's 8 sources are not resumable one by one)
for F in ${BUDGETS:-0.10 0.05 0.01}; do
  DEST=experiments/conversion_margin/$OUT/g$G-f$F
  [ -f "$DEST/conversion.json" ] && { echo "g$G f$F: done ($DEST)"; continue; }
  SCRATCH=budget; [ "$F" = 0.10 ] && SCRATCH=budget,total
  mhalab convert "$S"/{0,1,2,3,4,5,6,7}/checkpoints/last.ckpt --n-kv-heads "$G" --uptrain-fraction "$F" \
    --scratch "$SCRATCH" --mha-control --margin "$M" --threads "$THREADS" --out "$DEST"
done
