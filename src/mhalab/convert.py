"""MHA to GQA conversion: `python -m mhalab.convert <checkpoint> n_kv_heads=G [init=mean,first,random]
[uptrain_fraction=0.05] [scratch=budget|<ckpt>,...] [out=DIR]`.

Ainslie et al. 2023: a multi-head checkpoint becomes a grouped-query one by mean-pooling, per group, the key and
value projection heads of the query heads that will share one KV head; then the model is *uptrained* for a small
fraction of the original training steps. For comparison the KV heads can also be initialised from the first head
of each group (`first`) or at random (`random`, N(0, 0.02) as a fresh model).

The source may be MHA or GQA with S KV heads; G must divide S (each new KV head pools S / G contiguous source heads,
so query head i still reads the pool of the heads it read before). G = S is the identity.

For each init the command evaluates the converted model before and after uptraining for
ceil(uptrain_fraction * original steps) optimizer steps (original steps from the run's summary.json), with the
run's data, batch size and optimiser (warm-up shortened to 10% of the uptraining), and compares with the MHA
source and with GQA trained from scratch: `scratch=budget` trains a fresh GQA model for the same number of steps
as the uptraining (equal extra compute); `scratch=<path>` evaluates a GQA checkpoint trained from scratch
(e.g. the n_kv_heads=G run of experiment=kv_sweep, the full budget). Several comma-separated entries are allowed.

Outputs in `out` (default `<run_dir>/convert_gqa<G>`): `conversion.md/.csv/.json` and `conversion.png`.
Arguments may be `key=value` or `--key value`.
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

from mhalab.ablate import eval_batches, evaluate, kv_args
from mhalab.checkpoint import build_data, load_run_config, run_dir_of
from mhalab.errors import ConfigError
from mhalab.plots import new_figure

INITS = ("mean", "first", "random")


def _pool_rows(weight: torch.Tensor, n_src: int, n_dst: int, d_head: int, init: str,
               generator: torch.Generator | None = None) -> torch.Tensor:
    """(n_src * d_head, ...) projection rows -> (n_dst * d_head, ...): each new head from n_src / n_dst old ones."""
    r = n_src // n_dst
    w = weight.detach().reshape(n_dst, r, d_head, *weight.shape[1:])  # (G, r, D, ...)
    if init == "mean":
        out = w.mean(1)
    elif init == "first":
        out = w[:, 0]
    elif init == "random":
        out = torch.zeros_like(w[:, 0])
        if weight.dim() > 1:  # biases start at 0, weights N(0, 0.02) like a fresh model (mhalab.model._init_weights)
            out.normal_(0.0, 0.02, generator=generator)
    else:
        raise ConfigError(f"init={init!r}: init must be one of {', '.join(INITS)}")
    return out.reshape(n_dst * d_head, *weight.shape[1:]).contiguous()


def convert_module(module, n_kv_heads: int, init: str = "mean", seed: int = 0):
    """A new AttentionLitModule with n_kv_heads KV heads per layer, every other weight copied from `module`."""
    from mhalab.module import AttentionLitModule

    if init not in INITS:
        raise ConfigError(f"init={init!r}: init must be one of {', '.join(INITS)}")
    cfg = module.model_cfg
    src = cfg.n_kv_heads or cfg.n_heads
    if not isinstance(n_kv_heads, int) or isinstance(n_kv_heads, bool) or n_kv_heads <= 0:
        raise ConfigError(f"n_kv_heads={n_kv_heads!r}: n_kv_heads must be a positive integer")
    if cfg.n_heads % n_kv_heads:
        raise ConfigError(f"n_kv_heads={n_kv_heads} with n_heads={cfg.n_heads}: n_kv_heads must divide n_heads")
    if src % n_kv_heads:
        raise ConfigError(f"n_kv_heads={n_kv_heads} with a source of {src} KV heads: n_kv_heads must divide the "
                          "source's KV heads (each new KV head pools a group of them)")
    hp = dict(module.hparams)
    hp.pop("_instantiator", None)
    new_cfg = {**cfg.to_dict(), "n_kv_heads": n_kv_heads}
    new = AttentionLitModule(**{**{k: hp[k] for k in ("objective", "n_classes", "optim", "pooling", "tie_weights",
                                                      "token_bytes") if k in hp}, "model_cfg": new_cfg})
    g = torch.Generator().manual_seed(seed)
    state = module.state_dict()
    new_state = new.state_dict()
    for name in new_state:
        if any(name.endswith(f"{p}.{t}") for p in ("k_proj", "v_proj") for t in ("weight", "bias")):
            new_state[name] = _pool_rows(state[name], src, n_kv_heads, cfg.d_head, init, g)
        else:
            new_state[name] = state[name].clone()
    new.load_state_dict(new_state, strict=True)
    return new.eval()


def uptrain(module, dm, steps: int, run_cfg: dict[str, Any], out: Path, name: str, seed: int = 0,
            lr: float | None = None) -> dict[str, Any]:
    """Train `module` in place for `steps` optimizer steps on the run's training data; returns timings."""
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    if steps <= 0:
        return {"steps": 0, "fit_s": 0.0}
    optim = dict(module.hparams.optim)
    optim["warmup_ratio"], optim["warmup_steps"] = 0.1, 0
    if lr is not None:
        optim["lr"] = lr
    module.hparams.optim = optim
    L.seed_everything(seed, workers=True)
    tr = run_cfg.get("trainer") or {}
    trainer = L.Trainer(accelerator="cpu" if not torch.cuda.is_available() else "auto", devices=1,
                        max_steps=steps, max_epochs=-1, limit_val_batches=0, num_sanity_val_steps=0,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        gradient_clip_val=tr.get("gradient_clip_val", 1.0), precision=tr.get("precision", "32-true"),
                        logger=CSVLogger(str(out), name="uptrain", version=name), log_every_n_steps=max(1, steps // 10))
    t = time.perf_counter()
    module.train()
    trainer.fit(module, train_dataloaders=dm.train_dataloader())
    module.eval()
    return {"steps": int(trainer.global_step), "fit_s": time.perf_counter() - t}


def _row(model: str, init: str, stage: str, steps: int, metrics: dict[str, float], n_kv: int, params: int) -> dict:
    return {"model": model, "init": init, "stage": stage, "n_kv_heads": n_kv, "uptrain_steps": steps,
            "params": params, **metrics}


def convert(ckpt: str | Path, n_kv_heads: int, inits: list[str] | None = None, uptrain_fraction: float = 0.05,
            scratch: list[str] | None = None, out: str | Path | None = None, split: str = "validation",
            max_batches: int | None = 20, seed: int = 0, lr: float | None = None,
            original_steps: int | None = None, run_dir: str | Path | None = None) -> dict[str, Any]:
    """Convert, uptrain, evaluate and write the outputs; returns {"rows", "out", ...}."""
    from mhalab.checkpoint import load_module
    from mhalab.module import AttentionLitModule

    inits = inits or list(INITS)
    for i in inits:
        if i not in INITS:
            raise ConfigError(f"init={i!r}: init must be one of {', '.join(INITS)}")
    if not 0 <= uptrain_fraction <= 10:
        raise ConfigError(f"uptrain_fraction={uptrain_fraction!r}: give a fraction of the original steps, e.g. 0.05")
    scratch = ["budget"] if scratch is None else scratch
    src = load_module(ckpt)
    run_cfg = load_run_config(ckpt, run_dir)
    convert_module(src, n_kv_heads, inits[0])  # fail early on a wrong architecture, before any data is read
    if original_steps is None:
        original_steps = ((run_cfg.get("_summary") or {}).get("timings") or {}).get("train_steps")
        if original_steps is None:
            raise ConfigError(f"the run of {ckpt} has no timings.train_steps in summary.json: give original_steps=N")
    steps = math.ceil(uptrain_fraction * int(original_steps))
    dm = build_data(run_cfg)
    batches = eval_batches(dm, split, max_batches)
    out = Path(out) if out else run_dir_of(ckpt) / f"convert_gqa{n_kv_heads}"
    out.mkdir(parents=True, exist_ok=True)

    n_src = src.model_cfg.n_kv_heads or src.model_cfg.n_heads
    nparams = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    rows = [_row("source (MHA)" if n_src == src.model_cfg.n_heads else f"source (GQA-{n_src})", "-", "trained",
                 int(original_steps), evaluate(src, batches), n_src, nparams(src))]
    for init in inits:
        conv = convert_module(src, n_kv_heads, init, seed=seed)
        rows.append(_row(f"converted GQA-{n_kv_heads}", init, "before uptraining", 0, evaluate(conv, batches),
                         n_kv_heads, nparams(conv)))
        t = uptrain(conv, dm, steps, run_cfg, out, f"{init}", seed=seed, lr=lr)
        rows.append(_row(f"converted GQA-{n_kv_heads}", init, "after uptraining", t["steps"],
                         evaluate(conv, batches), n_kv_heads, nparams(conv)))
    for entry in scratch:
        if entry in ("none", ""):
            continue
        if entry == "budget":
            import lightning as L

            L.seed_everything(seed, workers=True)
            hp = dict(src.hparams)
            hp.pop("_instantiator", None)
            fresh = AttentionLitModule(**{**{k: copy.deepcopy(hp[k]) for k in ("objective", "n_classes", "optim",
                                                                               "pooling", "tie_weights", "token_bytes")
                                             if k in hp},
                                          "model_cfg": {**src.model_cfg.to_dict(), "n_kv_heads": n_kv_heads}})
            t = uptrain(fresh, dm, steps, run_cfg, out, "scratch", seed=seed, lr=lr)
            rows.append(_row(f"GQA-{n_kv_heads} from scratch", "random", "same steps as uptraining", t["steps"],
                             evaluate(fresh, batches), n_kv_heads, nparams(fresh)))
        else:
            other = load_module(entry)
            o_kv = other.model_cfg.n_kv_heads or other.model_cfg.n_heads
            o_steps = ((load_run_config(entry).get("_summary") or {}).get("timings") or {}).get("train_steps")
            rows.append(_row(f"GQA-{o_kv} from scratch ({Path(entry).name})", "random", "trained", o_steps or -1,
                             evaluate(other, batches), o_kv, nparams(other)))

    metrics = [k for k in ("loss", "acc", "bpb") if k in rows[0]]
    cols = ["model", "init", "stage", "n_kv_heads", "uptrain_steps", "params"] + metrics
    with (out / "conversion.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    fmt = lambda v: f"{v:.4f}" if isinstance(v, float) else str(v)  # noqa: E731
    task = run_cfg.get("data", {}).get("task")
    md = (f"# MHA -> GQA-{n_kv_heads} conversion: {Path(ckpt).name}\n\nTask {task}; {split} split "
          f"({len(batches)} batches). Uptraining: {steps} steps = {uptrain_fraction:g} x {original_steps} original "
          f"steps. `acc` is masked-token accuracy for LM tasks; `bpb` bits per byte (lower is better).\n\n"
          + "\n".join(["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)] +
                      ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]) + "\n")
    (out / "conversion.md").write_text(md)
    result = {"checkpoint": str(ckpt), "task": task, "n_kv_heads": n_kv_heads, "uptrain_steps": steps,
              "original_steps": original_steps, "uptrain_fraction": uptrain_fraction, "rows": rows}
    (out / "conversion.json").write_text(json.dumps(result, indent=2))
    plot_conversion(rows, "bpb" if "bpb" in metrics else "acc", out / "conversion.png", n_kv_heads, task)
    result["out"] = out
    return result


def plot_conversion(rows: list[dict], key: str, path: Path, g: int, task: str | None) -> None:
    
    fig = new_figure(figsize=(8, 4))
    ax = fig.add_subplot()
    labels = [f"{r['model']}\n{r['init']} {r['stage']}" if r["init"] != "-" else f"{r['model']}" for r in rows]
    colors = ["C0" if r["stage"] == "trained" and "source" in r["model"] else
              "C3" if "before" in r["stage"] else "C2" if "after" in r["stage"] else "C7" for r in rows]
    ax.bar(range(len(rows)), [r[key] for r in rows], color=colors)
    for i, r in enumerate(rows):
        ax.text(i, r[key], f"{r[key]:.3f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=6)
    ax.set_ylabel(key + (" (lower is better)" if key in ("bpb", "loss") else ""))
    ax.set_title(f"{task}: MHA -> GQA-{g} (red: converted, green: uptrained, grey: from scratch)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m mhalab.convert", description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--n-kv-heads", type=int, required=True, help="KV heads of the converted model (n_kv_heads=G)")
    p.add_argument("--init", default="mean,first,random", help="comma-separated: mean, first, random")
    p.add_argument("--uptrain-fraction", type=float, default=0.05, help="fraction of the original training steps")
    p.add_argument("--scratch", default="budget",
                   help="comma-separated: budget (train GQA from scratch for the uptraining steps), a GQA "
                        "checkpoint path, or none")
    p.add_argument("--out")
    p.add_argument("--split", default="validation", choices=["validation", "test"])
    p.add_argument("--batches", type=int, default=20, help="evaluation batches (0 = the whole split)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=None, help="uptraining peak lr (default: the run's optim.lr)")
    p.add_argument("--original-steps", type=int, default=None, help="default: timings.train_steps of the run")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's choice; 1 is much faster on a small, busy CPU)")
    p.add_argument("--run-dir")
    a = p.parse_args(kv_args(sys.argv[1:] if argv is None else argv))
    if a.threads:
        torch.set_num_threads(a.threads)
    try:
        r = convert(a.checkpoint, a.n_kv_heads, [s for s in a.init.split(",") if s], a.uptrain_fraction,
                    [s for s in a.scratch.split(",") if s], a.out, a.split, a.batches or None, a.seed, a.lr,
                    a.original_steps, a.run_dir)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print((r["out"] / "conversion.md").read_text())
    print(f"wrote {r['out']}")


if __name__ == "__main__":
    main()
