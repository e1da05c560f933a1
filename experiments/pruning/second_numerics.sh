#!/bin/bash
# pruning's second numerics (README.md, "Second numerics"): fresh sources under each numerics, then mhalab ablate on
# each set under the same numerics, one after another (2 threads must not share the 2 cores with other work).
# Run from the repository root; writes logs/mqar_sources/... and experiments/pruning/results-{avx2,threads2}.
# As it ran on 2026-11-26: the sources from a frozen copy of commit f29daad's src/, the ablations of 828442a's.
set -eu
src() { ls -td logs/mqar_sources/multiruns/* | while read -r d; do grep -q "seed=range($1)" "$d/multirun.yaml" && echo "$d" && break; done; }
ATEN_CPU_CAPABILITY=avx2 mhalab train -m experiment=mqar_sources 'seed=range(20,30)' torch_threads=1 hydra.launcher.n_jobs=2
A=$(src 20,30)
ATEN_CPU_CAPABILITY=avx2 mhalab ablate "$A"/{0,1,2,3,4,5,6,7,8,9}/checkpoints/last.ckpt --random-orders 10 --step 0.125 \
  --batches 0 --threads 1 --out experiments/pruning/results-avx2
mhalab train -m experiment=mqar_sources 'seed=range(30,40)' torch_threads=2 hydra.launcher.n_jobs=1
T=$(src 30,40)
mhalab ablate "$T"/{0,1,2,3,4,5,6,7,8,9}/checkpoints/last.ckpt --random-orders 10 --step 0.125 --batches 0 \
  --threads 2 --out experiments/pruning/results-threads2
mhalab report --numerics B:experiments/pruning/results/ablation.json avx2:experiments/pruning/results-avx2/ablation.json \
  threads2:experiments/pruning/results-threads2/ablation.json --out experiments/pruning
