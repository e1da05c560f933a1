#!/usr/bin/env bash
# Issue 19 protocol, this session: the kv_sweep d_ff control, then head_sweep; stage A over 3 learning rates,
# stage B the remaining seeds of each arm at the learning rate stage A chose for it on validation.
set -u
while ! grep -q "all done" /work/runs/protocol.log; do sleep 20; done
export PYTHONPATH=/work/wt-sweep/src MHALAB_ROOT=/work/runs
M=/work/main/.venv/bin/mhalab
P=/work/main/.venv/bin/python
cd /work/runs
LRS=1.0e-3,3.16e-3,1.0e-2
newest() { ls -d logs/$1/multiruns/*/ | tail -1; }
sweep() {  # name, seeds-A, seeds-B
  echo "== $(date -u +%T) stage A $1 seeds $2 lr $LRS"
  nice -n -5 $M train -m experiment=$1 seed=$2 optim.lr=$LRS > logs_$1_A.txt 2>&1
  A=$(newest $1); echo "== $(date -u +%T) end stage A $1 rc=$? dir $A"
  $P stage_b.py $A | tee stage_b_$1.txt
  while read arm lr; do
    echo "== $(date -u +%T) stage B $1 $arm $lr seeds $3"
    nice -n -5 $M train -m experiment=$1 seed=$3 $arm $lr >> logs_$1_B.txt 2>&1
    echo "== $(date -u +%T) end stage B rc=$? dir $(newest $1)"
  done < stage_b_$1.txt
}

sweep head_dim_sweep 0,1,2 3,4,5,6,7,8,9
echo "== $(date -u +%T) all done"
