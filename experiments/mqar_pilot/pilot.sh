#!/bin/bash
# One MQAR pilot run: ./pilot.sh NAME [overrides...]; prints val/acc at every validation (every 250 steps).
# Common settings: seed 42 (the default), batch 64, 500 validation sequences, one torch thread, no dropout.
NAME=$1; shift
mhalab train data=mqar logger=csv stats.every_n_steps=1000 stats.plots=false stats.importance=false \
  trainer.enable_progress_bar=false trainer.max_epochs=1000 trainer.val_check_interval=250 \
  trainer.check_val_every_n_epoch=null data.mqar.n_val=500 data.mqar.n_test=500 data.batch_size=64 torch_threads=1 \
  model.dropout=0.0 paths.root_dir=pilot/$NAME "$@" > pilot/$NAME.log 2>&1
echo "$NAME: $(grep -E 'step [0-9]+ \| val' pilot/$NAME.log | sed 's/.*INFO\] - //' | awk '{print $2":"$5}' | tr '\n' ' ')"
