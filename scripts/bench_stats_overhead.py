"""What do per-head statistics cost? Train the same config with statistics off and at the default cadence, in one
process, alternating, and print the wall-time ratio (baseline: statistics off, measured in the same run).

    python scripts/bench_stats_overhead.py [--steps 150] [--rounds 2] [overrides ...]

Overrides are train.yaml overrides (e.g. data=bbc_news_mlm attention=gqa). Validation is off in both arms, so the
difference is the periodic probe pass (every stats.every_n_steps steps) plus the one-off end-of-fit work (importance
over stats.importance_batches validation batches, and the PNG pictures), which is reported on its own as well.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import lightning as L
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from mhalab.callbacks import HeadStatsCallback
from mhalab.config import encoder_config, validate
from mhalab.data import build_datamodule
from mhalab.module import AttentionLitModule
from mhalab.train import CONF_DIR


def fit_seconds(cfg, dm, steps: int, stats_cb: HeadStatsCallback | None) -> float:
    L.seed_everything(cfg.seed, verbose=False)
    enc = encoder_config(cfg, dm.vocab_size, dm.causal)
    module = AttentionLitModule(enc.to_dict(), dm.objective, dm.n_classes, OmegaConf.to_container(cfg.optim),
                                pooling=cfg.model.pooling)
    trainer = L.Trainer(accelerator="cpu", max_steps=steps, limit_val_batches=0, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[stats_cb] if stats_cb else [], gradient_clip_val=cfg.trainer.gradient_clip_val)
    start = time.perf_counter()
    trainer.fit(module, datamodule=dm)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    os.environ.setdefault("MHALAB_ROOT", os.getcwd())
    os.environ.setdefault("MHALAB_RUN_ID", "bench")
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=args.overrides)
    validate(cfg)
    dm = build_datamodule(cfg.data, seed=cfg.seed)
    dm.prepare_data()
    dm.setup("fit")
    s = cfg.stats
    plot_dir = tempfile.mkdtemp(prefix="mhalab-stats-bench-")

    def callback():
        return HeadStatsCallback(dm.probe_batch(s.probe_size), every_n_steps=s.every_n_steps,
                                 importance=s.importance, importance_batches=s.importance_batches, plots=s.plots,
                                 plot_dir=plot_dir, decode=dm.decode, max_plot_tokens=s.max_plot_tokens)

    fit_seconds(cfg, dm, 5, None)  # warm-up: allocator, first-call overheads
    off, on = [], []
    for _ in range(args.rounds):
        off.append(fit_seconds(cfg, dm, args.steps, None))
        on.append(fit_seconds(cfg, dm, args.steps, callback()))

    # the parts, measured on their own
    enc = encoder_config(cfg, dm.vocab_size, dm.causal)
    module = AttentionLitModule(enc.to_dict(), dm.objective, dm.n_classes, OmegaConf.to_container(cfg.optim))
    cb = callback()
    passes = []
    for _ in range(5):
        t = time.perf_counter()
        cb.measure(module)
        passes.append(time.perf_counter() - t)
    t = time.perf_counter()
    cb.importance_table = cb.compute_importance(module, dm.val_dataloader()) if s.importance else {}
    cb.update(module)
    if s.plots:
        cb.draw(module)
    end_of_fit = time.perf_counter() - t

    t_off, t_on = statistics.median(off), statistics.median(on)
    step = t_off / args.steps
    print(f"config: data={cfg.data.task} d_model={cfg.model.d_model} n_layers={cfg.model.n_layers} "
          f"n_heads={cfg.attention.n_heads} batch={dm.batch_size} max_len={dm.max_len}; torch threads "
          f"{torch.get_num_threads()}; {args.steps} steps x {args.rounds} rounds, alternating")
    print(f"baseline (statistics off): {t_off:.2f} s  ({1e3 * step:.1f} ms/step)")
    print(f"statistics every {s.every_n_steps} steps + end-of-fit importance/plots: {t_on:.2f} s")
    print(f"ratio stats/baseline: {t_on / t_off:.3f}  (overhead {100 * (t_on / t_off - 1):+.1f}%)")
    print(f"parts: one probe pass {1e3 * statistics.median(passes):.1f} ms = "
          f"{100 * statistics.median(passes) / (s.every_n_steps * step):.2f}% of {s.every_n_steps} steps; "
          f"end of fit (importance over {s.importance_batches} batches + plots) {end_of_fit:.2f} s once")
    print(f"runs: off {[round(x, 2) for x in off]}  on {[round(x, 2) for x in on]}")


if __name__ == "__main__":
    main()
