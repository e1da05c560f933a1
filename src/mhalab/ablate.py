"""Head ablation and pruning: `python -m mhalab.ablate <checkpoint> [--split validation] [--batches N] [--out DIR]`.

For a checkpoint written by `mhalab.train` (loaded with `mhalab.checkpoint.load_module`, weights only):

1. single-head ablation: the change in loss / accuracy (and bits per byte for LM tasks) when one head is removed,
   for every head, two ways: *zero* ablation (its `head_gate` set to 0, so its output is exactly 0) and *mean*
   ablation (its output replaced by its mean over the evaluation tokens, through a forward pre-hook on `out_proj`,
   whose input is the concatenation of the gated heads);
2. head importance I_h = mean over examples of |dL(x) / d gate_h| (Michel et al. 2019, normalised per layer;
   docs/definitions.md#head-importance) and its ranking;
3. iterative pruning (Michel et al. 2019): remove the least important `--step` (10%) of all heads, re-estimate the
   importance of the remaining heads, repeat until every head is gone; accuracy / loss vs fraction pruned.

The data are rebuilt from the run's saved config (`<run_dir>/summary.json`, or `<run_dir>/.hydra/config.yaml`,
the run dir being the checkpoint's folder's parent). Outputs in `--out` (default `<run_dir>/ablation`):
`heads.md/.csv` (one row per head, and a first row "none" for the full model), `pruning.md/.csv`,
`ablation.json`, `ablation_heatmap.png`, `pruning_curve.png`.

Arguments may also be given as `key=value` (e.g. `split=test batches=20`).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from torch import Tensor

from mhalab.errors import ConfigError
from mhalab.checkpoint import build_data, load_run_config, run_dir_of
from mhalab.plots import new_figure


# -- run config and data ------------------------------------------------------------------------------------

def eval_batches(dm, split: str = "validation", max_batches: int | None = None) -> list[dict[str, Tensor]]:
    """The first `max_batches` batches of a split, materialised once (MLM masks are fixed for val/test)."""
    if split not in ("validation", "test"):
        raise ConfigError(f"split={split!r}: split must be validation or test")
    loader = dm.val_dataloader() if split == "validation" else dm.test_dataloader()
    out = []
    for i, b in enumerate(loader):
        if max_batches is not None and i >= max_batches:
            break
        out.append(b)
    if not out:
        raise ConfigError(f"the {split} split is empty")
    return out


# -- evaluation ---------------------------------------------------------------------------------------------

@torch.no_grad()
def evaluate(module, batches: Iterable[dict[str, Tensor]]) -> dict[str, float]:
    """Token-weighted loss, accuracy and (LM) bits per byte over the batches, in eval mode."""
    import torch.nn.functional as F

    was_training = module.training
    module.eval()
    nats = n = correct = nbytes = 0.0
    for b in batches:
        _, logits, labels = module.loss_and_logits(b)
        valid = labels != -100
        lg, lb = logits.float()[valid], labels[valid]
        nats += F.cross_entropy(lg, lb, reduction="sum").item()
        correct += (lg.argmax(-1) == lb).sum().item()
        n += lb.numel()
        if getattr(module, "is_lm", False):
            nbytes += module.token_bytes[lb].sum().item()
    module.train(was_training)
    out = {"loss": nats / max(n, 1), "acc": correct / max(n, 1)}
    if getattr(module, "is_lm", False):
        out["bpb"] = nats / (math.log(2) * max(nbytes, 1))
    return out


def loss_fn(module, batch: dict[str, Tensor]) -> Tensor:
    return module.loss_and_logits(batch)[0]


def importance(module, batches: list[dict[str, Tensor]]) -> Tensor:
    """(n_layers, n_heads) head importance (Michel et al. 2019), normalised per layer; pruned heads get 0."""
    from mhalab.stats import head_importance

    was_training = module.training
    module.eval()
    try:
        imp = head_importance(module, batches, loss_fn, normalize=True)
    finally:
        module.train(was_training)
    return imp


class MeanAblation:
    """Replace chosen heads' outputs by their mean over the evaluation tokens (forward pre-hooks on out_proj).

    `fit(batches)` records, per layer and head, the mean of the head's slice of the out_proj input over
    non-padding positions; then `with ablation.active({(layer, head), ...}):` evaluates with those heads replaced.
    """

    def __init__(self, module):
        self.module = module
        self.layers = list(module.attention_layers())
        self.means: list[Tensor] = []
        self._selected: dict[int, list[int]] = {}

    @torch.no_grad()
    def fit(self, batches: list[dict[str, Tensor]]) -> "MeanAblation":
        sums = [torch.zeros(l.n_heads * l.d_head, dtype=torch.float64) for l in self.layers]
        counts = [0] * len(self.layers)
        current: dict[str, Tensor | None] = {"mask": None}

        def make_hook(i: int) -> Callable:
            def hook(mod, args):
                x = args[0]  # (B, T, H*D)
                pad = current["mask"]
                if pad is not None and pad.shape == x.shape[:2]:
                    keep = ~pad
                else:
                    keep = torch.ones(x.shape[:2], dtype=torch.bool)
                sums[i] += x[keep].double().sum(0)
                counts[i] += int(keep.sum())
            return hook

        handles = [l.out_proj.register_forward_pre_hook(make_hook(i)) for i, l in enumerate(self.layers)]
        was_training = self.module.training
        self.module.eval()
        try:
            for b in batches:
                current["mask"] = b.get("padding_mask")
                self.module(b)
        finally:
            for h in handles:
                h.remove()
            self.module.train(was_training)
        self.means = [(s / max(c, 1)).float() for s, c in zip(sums, counts)]
        return self

    def active(self, heads: Iterable[tuple[int, int]]):
        import contextlib

        selected: dict[int, list[int]] = {}
        for l, h in heads:
            selected.setdefault(l, []).append(h)

        @contextlib.contextmanager
        def ctx():
            handles = []
            for l, hs in selected.items():
                layer, mean = self.layers[l], self.means[l]
                d = layer.d_head

                def hook(mod, args, hs=hs, mean=mean, d=d):
                    x = args[0].clone()
                    for h in hs:
                        x[..., h * d:(h + 1) * d] = mean[h * d:(h + 1) * d].to(x.dtype)
                    return (x,) + tuple(args[1:])
                handles.append(layer.out_proj.register_forward_pre_hook(hook))
            try:
                yield
            finally:
                for hd in handles:
                    hd.remove()
        return ctx()


def gates(module) -> list[Tensor]:
    return [l.head_gate for l in module.attention_layers()]


def single_head_ablation(module, batches: list[dict[str, Tensor]]) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """(full-model metrics, one row per head with zero- and mean-ablation metrics and deltas)."""
    base = evaluate(module, batches)
    mean_abl = MeanAblation(module).fit(batches)
    rows = []
    for l, layer in enumerate(module.attention_layers()):
        for h in range(layer.n_heads):
            old = layer.head_gate[h].item()
            layer.head_gate[h] = 0.0
            try:
                z = evaluate(module, batches)
            finally:
                layer.head_gate[h] = old
            with mean_abl.active([(l, h)]):
                m = evaluate(module, batches)
            row: dict[str, Any] = {"head": f"L{l}H{h}", "layer": l, "index": h}
            for k in base:
                row[f"zero_{k}"], row[f"mean_{k}"] = z[k], m[k]
                row[f"zero_d{k}"], row[f"mean_d{k}"] = z[k] - base[k], m[k] - base[k]
            rows.append(row)
    return base, rows


def pruning_curve(module, batches: list[dict[str, Tensor]], step: float = 0.1,
                  importance_batches: list[dict[str, Tensor]] | None = None) -> list[dict[str, Any]]:
    """Iterative pruning (Michel et al. 2019): prune ceil(step * N) of the N heads at a time, lowest importance
    first (importance re-estimated on the remaining heads after every step), until all N are pruned.

    Returns one row per step: n_pruned, fraction, metrics, the heads pruned at that step. The gates are restored.
    """
    if not 0 < step <= 1:
        raise ConfigError(f"step={step!r}: the pruning step must be a fraction in (0, 1]")
    layers = list(module.attention_layers())
    saved = [g.detach().clone() for g in gates(module)]
    total = sum(l.n_heads for l in layers)
    k = max(1, math.ceil(step * total - 1e-9))
    imp_batches = importance_batches or batches
    rows = [{"n_pruned": 0, "fraction": 0.0, **evaluate(module, batches), "pruned_now": ""}]
    pruned: set[tuple[int, int]] = set()
    try:
        while len(pruned) < total:
            imp = importance(module, imp_batches)  # (L, H)
            cands = sorted(((imp[l, h].item(), l, h) for l, layer in enumerate(layers) for h in range(layer.n_heads)
                            if (l, h) not in pruned), key=lambda t: (t[0], t[1], t[2]))
            now = cands[:min(k, total - len(pruned))]
            for _, l, h in now:
                layers[l].head_gate[h] = 0.0
                pruned.add((l, h))
            rows.append({"n_pruned": len(pruned), "fraction": len(pruned) / total, **evaluate(module, batches),
                         "pruned_now": " ".join(f"L{l}H{h}" for _, l, h in now)})
    finally:
        for g, s in zip(gates(module), saved):
            g.copy_(s)
    return rows


# -- outputs ------------------------------------------------------------------------------------------------

def _md_table(rows: list[dict], cols: list[str]) -> str:
    def f(v):
        return f"{v:.4f}" if isinstance(v, float) else str(v)
    return "\n".join(["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)] +
                     ["| " + " | ".join(f(r.get(c, "")) for c in cols) + " |" for r in rows])


def _write_csv(rows: list[dict], cols: list[str], path: Path) -> None:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def plot_heatmaps(rows: list[dict], n_layers: int, n_heads: int, key: str, path: Path) -> None:
    
    panels = [("importance", "importance (Michel et al.)"), (f"zero_d{key}", f"zero ablation: Δ{key}"),
              (f"mean_d{key}", f"mean ablation: Δ{key}")]
    fig = new_figure(figsize=(4.2 * len(panels), 0.6 * n_layers + 2))
    for i, (col, title) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        mat = torch.zeros(n_layers, n_heads)
        for r in rows:
            mat[r["layer"], r["index"]] = r[col]
        lim = mat.abs().max().item()
        scale = {} if col == "importance" else {"vmin": -lim, "vmax": lim}
        im = ax.imshow(mat.numpy(), cmap="viridis" if col == "importance" else "coolwarm", aspect="auto", **scale)
        for l in range(n_layers):
            for h in range(n_heads):
                ax.text(h, l, f"{mat[l, h].item():.3g}", ha="center", va="center", fontsize=6)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(n_heads))
        ax.set_yticks(range(n_layers))
        ax.set_title(title, fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_pruning(curve: list[dict], key: str, path: Path, title: str = "") -> None:
    
    fig = new_figure(figsize=(9, 3.8))
    ax1, ax2 = fig.subplots(1, 2)
    xs = [100 * r["fraction"] for r in curve]
    ax1.plot(xs, [r["acc"] for r in curve], marker="o")
    ax1.set_ylabel("accuracy" + (" (masked-token)" if key == "bpb" else ""))
    ax2.plot(xs, [r[key] for r in curve], marker="o", color="C1")
    ax2.set_ylabel(key + (" (lower is better)" if key in ("bpb", "loss") else ""))
    for ax in (ax1, ax2):
        ax.set_xlabel("% of heads pruned")
        ax.grid(alpha=0.3)
    fig.suptitle((title or "iterative head pruning (Michel et al. 2019)") +
                 "\nleast important heads first, importance re-estimated after each step", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def ablate(ckpt: str | Path, out: str | Path | None = None, split: str = "validation",
           max_batches: int | None = 20, step: float = 0.1, prune: bool = True,
           run_dir: str | Path | None = None, batch_size: int | None = None, seed: int = 0) -> dict[str, Any]:
    """Run everything and write the outputs; returns {"base", "heads", "pruning", "out"}."""
    from mhalab.checkpoint import load_module

    torch.manual_seed(seed)
    module = load_module(ckpt)
    run_cfg = load_run_config(ckpt, run_dir)
    dm = build_data(run_cfg, batch_size)
    batches = eval_batches(dm, split, max_batches)
    base, rows = single_head_ablation(module, batches)
    imp = importance(module, batches)
    order = sorted(rows, key=lambda r: -imp[r["layer"], r["index"]].item())
    for rank, r in enumerate(order, 1):
        r["importance"] = imp[r["layer"], r["index"]].item()
        r["rank"] = rank
    curve = pruning_curve(module, batches, step) if prune else []

    out = Path(out) if out else run_dir_of(ckpt) / "ablation"
    out.mkdir(parents=True, exist_ok=True)
    key = "bpb" if "bpb" in base else "loss"
    metrics = list(base)
    head_cols = ["head", "layer", "index", "importance", "rank"] + \
        [f"{kind}_d{m}" for kind in ("zero", "mean") for m in metrics] + \
        [f"{kind}_{m}" for kind in ("zero", "mean") for m in metrics]
    full_row = {"head": "none", "layer": "", "index": "", "importance": "", "rank": "",
                **{f"{kind}_{m}": base[m] for kind in ("zero", "mean") for m in metrics},
                **{f"{kind}_d{m}": 0.0 for kind in ("zero", "mean") for m in metrics}}
    all_rows = [full_row] + rows
    _write_csv(all_rows, head_cols, out / "heads.csv")
    short = ["head", "importance", "rank"] + [f"{kind}_d{m}" for kind in ("zero", "mean") for m in metrics]
    task = run_cfg.get("data", {}).get("task")
    (out / "heads.md").write_text(
        f"# Single-head ablation: {Path(ckpt).name}\n\nTask {task}, {split} split ({len(batches)} batches). "
        f"Full model: " + ", ".join(f"{k} {v:.4f}" for k, v in base.items()) +
        ". Δ = ablated minus full model (zero: head output set to 0; mean: replaced by its mean over the "
        "evaluation tokens). Importance: E|dL/d gate| normalised per layer (Michel et al. 2019), rank 1 = most "
        "important.\n\n" + _md_table(all_rows, short) + "\n")
    curve_cols = ["n_pruned", "fraction"] + metrics + ["pruned_now"]
    if curve:
        _write_csv(curve, curve_cols, out / "pruning.csv")
        (out / "pruning.md").write_text(
            f"# Iterative head pruning: {Path(ckpt).name}\n\nPrune the least important {step:.0%} of the heads "
            f"at a time, re-estimating importance after each step; {split} split.\n\n" +
            _md_table(curve, curve_cols) + "\n")
        plot_pruning(curve, key, out / "pruning_curve.png", f"{task}: iterative head pruning ({Path(ckpt).name})")
    layers = list(module.attention_layers())
    plot_heatmaps(rows, len(layers), layers[0].n_heads, key, out / "ablation_heatmap.png")
    result = {"checkpoint": str(ckpt), "task": task, "split": split, "batches": len(batches), "base": base,
              "heads": rows, "pruning": curve}
    (out / "ablation.json").write_text(json.dumps(result, indent=2))
    result["out"] = out
    return result


def kv_args(argv: list[str]) -> list[str]:
    """`key=value` arguments become `--key value` (dashes for underscores)."""
    out = []
    for a in argv:
        if "=" in a and not a.startswith("-") and not Path(a).exists():
            k, v = a.split("=", 1)
            out += [f"--{k.replace('_', '-')}", v]
        else:
            out.append(a)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m mhalab.ablate", description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--out", help="output folder (default <run_dir>/ablation)")
    p.add_argument("--split", default="validation", choices=["validation", "test"])
    p.add_argument("--batches", type=int, default=20, help="evaluation batches (0 = the whole split)")
    p.add_argument("--batch-size", type=int, default=None, help="default: the run's data.batch_size")
    p.add_argument("--step", type=float, default=0.1, help="fraction of all heads pruned per step")
    p.add_argument("--no-prune", action="store_true", help="skip the pruning curve")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's choice; 1 is much faster on a small, busy CPU)")
    p.add_argument("--run-dir", help="training run directory holding summary.json (default: inferred)")
    a = p.parse_args(kv_args(sys.argv[1:] if argv is None else argv))
    if a.threads:
        torch.set_num_threads(a.threads)
    try:
        r = ablate(a.checkpoint, a.out, a.split, a.batches or None, a.step, not a.no_prune, a.run_dir, a.batch_size)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print((r["out"] / "heads.md").read_text())
    if r["pruning"]:
        print((r["out"] / "pruning.md").read_text())
    print(f"wrote {r['out']}")


if __name__ == "__main__":
    main()
