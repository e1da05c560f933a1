#!/bin/bash
# The GPU session in one command: a many-seeds MQAR sweep, then `mhalab bench gpu`, everything under $1.
#   experiments/gpu/run.sh OUT_DIR                   # on a CUDA machine (about 9 minutes)
#   GPU_CHECK_DRY=1 experiments/gpu/run.sh OUT_DIR   # the same commands on the CPU, tiny: checks this script only
# 1. sweep: kv_sweep64's open question (experiments/kv_sweep64: stage A on the CPU chose optim.lr 3.16e-3 for every
#    arm; MQA reached 0.9 on 1 of 3 seeds): fresh seeds 10.. at that rate, n_kv_heads 4/2/1, float32 on the GPU
#    (the CPU's precision; PRECISION=bf16-mixed for trainer=gpu's own), SWEEP_JOBS jobs at a time, stopped after
#    SWEEP_S seconds (finished runs kept); SWEEP_S=0 skips it.
# 2. bench: `mhalab bench gpu` with budget_s BENCH_S (a step that would overrun is skipped, saying so); BENCH_STEPS
#    picks steps, e.g. BENCH_STEPS='[tests,train]'.
set -u
OUT=${1:?usage: experiments/gpu/run.sh OUT_DIR}
mkdir -p "$OUT"
SEEDS=${SEEDS:-"range(10,26)"}; PRECISION=${PRECISION:-32-true}; SWEEP_JOBS=${SWEEP_JOBS:-12}; SWEEP_S=${SWEEP_S:-200}; BENCH_S=${BENCH_S:-320}
if [ "${GPU_CHECK_DRY:-0}" = 1 ]; then
  TRAINER=(trainer.accelerator=cpu trainer.max_steps=20 trainer.val_check_interval=10 data.mqar.n_train=640)
  BENCH=(dry_run=true)
else
  TRAINER=(trainer=gpu "trainer.precision=$PRECISION")
  BENCH=('d_models=[1024]')  # the size the MFU goal names; 512 would add two torch.compile runs
fi
experiments/gpu/machine.sh "$OUT/machine.txt"

[ -n "${BENCH_STEPS:-}" ] && BENCH+=("steps=$BENCH_STEPS")
echo "== sweep $(date -u +%T)"
[ "$SWEEP_S" = 0 ] || MHALAB_ROOT="$OUT/sweep" timeout -s INT "$SWEEP_S" python3 -m mhalab train -m experiment=kv_sweep64 "${TRAINER[@]}" \
  optim.lr=3.16e-3 "seed=$SEEDS" attention.n_kv_heads=4,2,1 hydra.launcher.n_jobs="$SWEEP_JOBS" torch_threads=1 \
  > "$OUT/sweep.log" 2>&1
echo "sweep exit $? $(date -u +%T); summaries: $(find "$OUT/sweep" -name summary.json | wc -l)"
tail -5 "$OUT/sweep.log"

echo "== bench $(date -u +%T)"
python3 -m mhalab bench gpu out="$OUT/bench" budget_s="$BENCH_S" "${BENCH[@]}" > "$OUT/bench.log" 2>&1
echo "bench exit $? $(date -u +%T)"
tail -30 "$OUT/bench.log"
