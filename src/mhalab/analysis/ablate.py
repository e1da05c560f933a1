"""Head ablation and pruning: `mhalab ablate <checkpoint> [<checkpoint> ...]`.

For each checkpoint (several: one per seed of one configuration), importance is scored on one split
(`--importance-split`, default validation) and everything is evaluated on another (`--eval-split`, default test),
so no head is judged on the data that ranked it:

1. single-head ablation: the change of every metric when one head is removed, *zero* (its output at hook_z
   multiplied by 0) and *mean* (its output replaced by its mean over the evaluation tokens);
2. head importance (Michel et al. 2019: mean over examples of |dL(x)/d gate|, normalised per layer;
   docs/definitions.md#head-importance) and its rank;
3. pruning curves: remove `--step` (10%) of all heads at a time, (a) least important first with importance
   re-estimated on the remaining heads after every step (Michel's iterative pruning), (b) in `--random-orders`
   random orders, and (c) in the order of the single-head ablation loss measured on the importance split, the
   stronger baseline a ranking has to beat.

Across checkpoints, at every pruned fraction: the importance curve's mean with its 95% interval over seeds, the band
of the random orders (10th to 90th percentile of all seeds x orders), and the differences importance minus random
(each seed against the mean of its own random orders) and importance minus the ablation order, paired by checkpoint
(exact sign-flip test), Holm-adjusted over all levels and both comparisons (`mhalab.stats`).
Outputs in `--out` (default `<run_dir of the first checkpoint>/ablation`): heads.md/.csv, pruning.md/.csv,
ablation.json (with the tests as `comparisons`, in `mhalab report`'s form), runs.csv (each checkpoint's seed and
environment), ablation_heatmap.png, pruning_curve.png. `mhalab report --numerics A:<ablation.json> B:<...>` says of
each test whether its verdict holds across ablations of fresh checkpoints under different numerics.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch
from torch import Tensor

from mhalab.training.checkpoint import build_data, load_module, load_run, require_files, run_dir_of
from mhalab.checks import check_int, check_number
from mhalab.config.writes import check_links
from mhalab.training.console import each_with_progress
from mhalab.errors import ConfigError
from mhalab.model import eval_mode
from mhalab.training.evaluation import evaluate, headline, importance, split_batches
from mhalab.heads import head_label
from mhalab.hooks import act_name, hooks
from mhalab.stats import holm, lower_is_better, mean_ci, paired
from mhalab.tables import Table, write_csv
from mhalab.analysis.options import AblateOptions
from mhalab.pictures import new_figure
from mhalab.runs.summary import ENV_COLUMNS, env_row

def _by_layer(heads: Iterable[tuple[int, int]]) -> dict[int, list[int]]:
    selected: dict[int, list[int]] = {}
    for l, h in heads:
        selected.setdefault(l, []).append(h)
    return selected


def zero_heads(module, heads: Iterable[tuple[int, int]]):
    """A context in which the (layer, head) pairs are removed: their output at hook_z multiplied by 0."""
    def hook(hs: list[int]):
        def fn(z: Tensor, _) -> Tensor:  # (B, T, H, D)
            keep = torch.ones(z.shape[2], dtype=z.dtype, device=z.device)
            keep[hs] = 0.0
            return z * keep.view(1, 1, -1, 1)
        return fn

    return hooks(module, [(act_name("z", l), hook(hs)) for l, hs in _by_layer(heads).items()])


class MeanAblation:
    """Replace chosen heads' outputs by their mean over the evaluation tokens (at hook_z).

    `fit(batches)` records, per layer, the mean (H, D) of every head's output over non-padding positions; then
    `with ablation.active({(layer, head), ...}):` evaluates with those heads replaced.
    """

    def __init__(self, module):
        self.module = module
        self.layers = list(module.attention_layers())
        self.means: list[Tensor] = []  # per layer (H, D)

    @torch.no_grad()
    def fit(self, batches: list[dict[str, Tensor]]) -> "MeanAblation":
        sums = [torch.zeros(l.n_heads * l.d_head, dtype=torch.float64) for l in self.layers]
        counts = [0] * len(self.layers)
        current: dict[str, Tensor | None] = {"mask": None}

        def record(i: int) -> Callable:
            def fn(z: Tensor, _) -> None:  # (B, T, H, D)
                pad = current["mask"]
                keep = torch.ones(z.shape[:2], dtype=torch.bool)  # (B, T)
                if pad is not None and pad.shape == z.shape[:2]:
                    keep = ~pad
                sums[i] += z[keep].reshape(-1, sums[i].numel()).double().sum(0).cpu()
                counts[i] += int(keep.sum())
            return fn

        with hooks(self.module, [(act_name("z", i), record(i)) for i in range(len(self.layers))]), \
                eval_mode(self.module):
            for b in batches:
                current["mask"] = b.get("padding_mask")
                self.module(b)
        self.means = [(s / max(c, 1)).float().view(l.n_heads, l.d_head) for s, c, l in zip(sums, counts, self.layers)]
        return self

    def active(self, heads: Iterable[tuple[int, int]]):
        """A context in which the (layer, head) pairs output their mean."""
        def hook(hs: list[int], mean: Tensor):
            def fn(z: Tensor, _) -> Tensor:  # (B, T, H, D)
                z = z.clone()
                z[:, :, hs] = mean[hs].to(device=z.device, dtype=z.dtype)
                return z
            return fn

        return hooks(self.module, [(act_name("z", l), hook(hs, self.means[l])) for l, hs in _by_layer(heads).items()])


def single_head_ablation(module, batches: list[dict[str, Tensor]]) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """(full-model metrics, one row per head with zero- and mean-ablation metrics and deltas)."""
    base = evaluate(module, batches)
    mean_abl = MeanAblation(module).fit(batches)
    rows = []
    for l, h in _heads(module):
        with zero_heads(module, [(l, h)]):
            z = evaluate(module, batches)
        with mean_abl.active([(l, h)]):
            m = evaluate(module, batches)
        row: dict[str, Any] = {"head": head_label(l, h), "layer": l, "index": h}
        for k in base:
            row[f"zero_{k}"], row[f"mean_{k}"] = z[k], m[k]
            row[f"zero_d{k}"], row[f"mean_d{k}"] = z[k] - base[k], m[k] - base[k]
        rows.append(row)
    return base, rows


def _heads(module) -> list[tuple[int, int]]:
    return [(l, h) for l, layer in enumerate(module.attention_layers()) for h in range(layer.n_heads)]


def _pruned_row(module, batches, pruned: set, now: list[tuple[int, int]], total: int) -> dict[str, Any]:
    return {"n_pruned": len(pruned), "fraction": len(pruned) / total, **evaluate(module, batches),
            "pruned_now": " ".join(head_label(l, h) for l, h in now)}


def pruning_curve(module, batches: list[dict[str, Tensor]], step: float = 0.1,
                  importance_batches: list[dict[str, Tensor]] | None = None,
                  order: list[tuple[int, int]] | None = None) -> list[dict[str, Any]]:
    """Prune ceil(step * N) of the N heads at a time until all are gone; one row per step (n_pruned, fraction,
    metrics on `batches`, the heads pruned at that step). Without `order`, least important first, importance
    re-estimated on `importance_batches` (default `batches`) over the remaining heads after every step (Michel et
    al. 2019); with `order`, in that fixed order. Heads are removed through `zero_heads`, the model is unchanged."""
    check_number("--step", step, 0, 1, low_open=True)
    heads = _heads(module)
    total = len(heads)
    k = max(1, math.ceil(step * total - 1e-9))
    rows = [_pruned_row(module, batches, set(), [], total)]
    pruned: set[tuple[int, int]] = set()
    while len(pruned) < total:
        with zero_heads(module, sorted(pruned)):
            if order is None:
                imp = importance(module, importance_batches or batches)  # (L, H); pruned heads get 0
                ranked = sorted((h for h in heads if h not in pruned), key=lambda lh: (imp[lh].item(), lh))
            else:
                ranked = [h for h in order if h not in pruned]
        now = ranked[:k]
        pruned.update(now)
        with zero_heads(module, sorted(pruned)):
            rows.append(_pruned_row(module, batches, pruned, now, total))
    return rows


def random_orders(module, n: int, seed: int) -> list[list[tuple[int, int]]]:
    """n random orders of the heads, each from (seed, order index)."""
    heads = _heads(module)
    out = []
    for r in range(n):
        g = torch.Generator().manual_seed(seed * 1_000_003 + r)
        out.append([heads[i] for i in torch.randperm(len(heads), generator=g).tolist()])
    return out


def ablation_order(module, batches: list[dict[str, Tensor]]) -> list[tuple[int, int]]:
    """The heads ordered by what zero-ablating each alone costs on `batches` (least harmful first): the standard
    baseline a gradient importance has to beat, stronger than a random order."""
    base, rows = single_head_ablation(module, batches)
    key = headline(base)
    sign = 1 if lower_is_better(key) else -1  # cost of removing the head: a rise in loss or a drop in accuracy
    return [(r["layer"], r["index"]) for r in sorted(rows, key=lambda r: sign * r[f"zero_d{key}"])]


def ablate_one(ckpt: Path, importance_split: str, eval_split: str, max_batches: int | None, step: float,
               n_random: int, prune: bool, seed: int, batch_size: int | None = None) -> dict[str, Any]:
    """Everything for one checkpoint: base metrics, per-head rows, importance, curves."""
    module = load_module(ckpt)
    run_dir, summary = load_run(ckpt)
    dm = build_data(summary, batch_size, f"{run_dir}/summary.json")
    eval_batches = split_batches(dm, eval_split, max_batches)
    imp_batches = split_batches(dm, importance_split, max_batches)
    base, rows = single_head_ablation(module, eval_batches)
    imp = importance(module, imp_batches)
    for rank, r in enumerate(sorted(rows, key=lambda r: -imp[r["layer"], r["index"]].item()), 1):
        r["importance"], r["rank"] = imp[r["layer"], r["index"]].item(), rank
    curves = {}
    if prune:
        curves["importance"] = pruning_curve(module, eval_batches, step, imp_batches)
        curves["ablation"] = pruning_curve(module, eval_batches, step, order=ablation_order(module, imp_batches))
        curves["random"] = [pruning_curve(module, eval_batches, step, order=o)
                            for o in random_orders(module, n_random, seed)]
    return {"checkpoint": str(ckpt), "run_dir": str(run_dir), "task": summary.task,
            "seed": summary.config.get("seed"), "base": base, "heads": rows, "curves": curves,
            "environment": env_row(summary.environment),  # runs.csv's env_* columns
            "n_layers": len(module.attention_layers()), "n_heads": module.arch.attention.n_heads}


def aggregate_curves(results: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """Per pruned fraction over checkpoints: the importance curve (mean, 95% interval), the ablation-order curve,
    the random band, and the differences importance - random (each checkpoint against the mean of its random
    orders) and importance - ablation order, each paired by checkpoint (the same model pruned two ways: the exact
    sign-flip test), Holm-adjusted over every level and both comparisons."""
    rows = []
    n_points = len(results[0]["curves"]["importance"])
    for i in range(n_points):
        frac = results[0]["curves"]["importance"][i]["fraction"]
        by_imp = [r["curves"]["importance"][i][key] for r in results]
        by_abl = [r["curves"]["ablation"][i][key] for r in results if "ablation" in r["curves"]]
        by_rand = [[c[i][key] for c in r["curves"]["random"]] for r in results]
        rand_all = sorted(v for vs in by_rand for v in vs)
        mean, lo, hi = mean_ci(by_imp)
        row = {"fraction": frac, "n_pruned": results[0]["curves"]["importance"][i]["n_pruned"],
               f"importance_{key}": mean, "importance_ci95_low": lo, "importance_ci95_high": hi,
               f"ablation_{key}": sum(by_abl) / len(by_abl) if by_abl else None,
               f"random_{key}": sum(rand_all) / len(rand_all) if rand_all else None,
               "random_p10": _percentile(rand_all, 0.10), "random_p90": _percentile(rand_all, 0.90)}
        if by_rand[0] and frac > 0:
            d = paired([a - sum(b) / len(b) for a, b in zip(by_imp, by_rand)])
            row.update({f"vs_random_{k}": v for k, v in d.to_dict().items()})
        if len(by_abl) == len(by_imp) and frac > 0:
            d = paired([a - b for a, b in zip(by_imp, by_abl)])
            row.update({f"vs_ablation_{k}": v for k, v in d.to_dict().items()})
        rows.append(row)
    tests = [(r, side) for r in rows for side in ("vs_random", "vs_ablation") if r.get(f"{side}_p") is not None]
    for (r, side), adj in zip(tests, holm([r[f"{side}_p"] for r, side in tests])):
        r[f"{side}_p_holm"] = adj
        if not r.get(f"{side}_degenerate"):
            r[f"{side}_verdict"] = "separated" if adj < 0.05 else "not separated"
    return rows


def comparisons(agg: list[dict[str, Any]], key: str, n_heads: int) -> list[dict[str, Any]]:
    """The pruning table's tests in `mhalab report`'s comparison form (arm, baseline, endpoint, estimate, interval,
    p, Holm p, verdict), so that `mhalab report --numerics` compares them across numerics like a report's."""
    out = []
    for r in agg:
        for side, baseline in (("vs_random", "random orders (mean)"), ("vs_ablation", "single-head ablation order")):
            if f"{side}_mean" in r:
                out.append({"arm": "importance order", "baseline": baseline,
                            "endpoint": f"test {key} with {r['n_pruned']} of {n_heads} heads pruned",
                            "estimate": r[f"{side}_mean"], "ci95_low": r.get(f"{side}_ci95_low"),
                            "ci95_high": r.get(f"{side}_ci95_high"), "p": r.get(f"{side}_p"),
                            "p_holm": r.get(f"{side}_p_holm"), "degenerate": r.get(f"{side}_degenerate"),
                            "verdict": r.get(f"{side}_verdict") or "no test"})
    return out


def layer_summary(results: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """Per layer: the mean and the worst single-head zero-ablation change of `key` in each checkpoint, each as a
    mean over checkpoints with its 95% CI ("worst" = the largest drop, or the largest rise for a lower-is-better
    metric)."""
    worse = max if lower_is_better(key) else min
    rows = []
    for l in sorted({h["layer"] for h in results[0]["heads"]}):
        per_ckpt = [[h[f"zero_d{key}"] for h in r["heads"] if h["layer"] == l] for r in results]
        mean_d = mean_ci([sum(v) / len(v) for v in per_ckpt])
        worst_d = mean_ci([worse(v) for v in per_ckpt])
        rows.append({"layer": l, "n": len(results), "mean_d": mean_d[0], "mean_d_ci95_low": mean_d[1],
                     "mean_d_ci95_high": mean_d[2], "worst_d": worst_d[0], "worst_d_ci95_low": worst_d[1],
                     "worst_d_ci95_high": worst_d[2]})
    return rows


def _percentile(values: list[float], q: float) -> float | None:
    """numpy's quantile (linear interpolation), the one the report and the benchmarks use; None for no values."""
    return float(np.quantile(values, q)) if values else None


# -- outputs ------------------------------------------------------------------------------------------------

def _fmt(v: Any) -> str:
    return f"{v:.4f}" if isinstance(v, float) else ("-" if v is None else str(v))


def _md_table(rows: list[dict], cols: list[str]) -> str:
    table = Table(cols)
    for r in rows:
        table.add([_fmt(r.get(c)) for c in cols])
    return table.markdown()


def plot_heatmaps(rows: list[dict], n_layers: int, n_heads: int, key: str, path: Path, n_ckpts: int = 1):
    """Layer x head heatmaps of importance (0-1) and of zero and mean ablation, each the mean over the checkpoints;
    both ablations share a symmetric scale fitted to their effects (clipped at 4 x the median |Δ| when a few heads
    dwarf the rest; every cell's value is printed)."""
    over = f", mean of {n_ckpts} checkpoints" if n_ckpts > 1 else ""
    panels = [("importance", f"importance (Michel et al.){over}"),
              (f"zero_d{key}", f"zero ablation: Δ{key}{over}"), (f"mean_d{key}", f"mean ablation: Δ{key}{over}")]
    mats = {}
    for col, _ in panels:
        mat, count = torch.zeros(n_layers, n_heads), torch.zeros(n_layers, n_heads)  # (L, H)
        for r in rows:
            mat[r["layer"], r["index"]] += r[col]
            count[r["layer"], r["index"]] += 1
        mats[col] = mat / count.clamp(min=1)
    effects = torch.cat([mats[col].flatten() for col, _ in panels[1:]]).abs()
    top = effects.max().item()
    typical = effects.median().item()
    lim = (min(top, 4 * typical) if typical > 0 else top) or 1e-6  # clipped when a few heads dwarf the rest
    fig = new_figure(figsize=(4.6 * len(panels), 0.6 * n_layers + 2.4))
    for i, (col, title) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        mat = mats[col]
        if col == "importance":
            im = ax.imshow(mat.numpy(), cmap="viridis", aspect="auto", vmin=0.0, vmax=1.0)
        else:
            im = ax.imshow(mat.numpy(), cmap="coolwarm", aspect="auto", vmin=-lim, vmax=lim)
            title += f"\ncolour ±{lim:.2g}" + (" (clipped: a few heads go beyond)" if top > lim * 1.0001 else "")
        for l in range(n_layers):
            for h in range(n_heads):
                ax.text(h, l, f"{mat[l, h].item():.3g}", ha="center", va="center", fontsize=7)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(n_heads))
        ax.set_yticks(range(n_layers))
        ax.set_title(title, fontsize=10)
        bar = fig.colorbar(im, ax=ax, fraction=0.046, extend="neither" if col == "importance" or top <= lim * 1.0001
                           else "both")
        helps = "> 0" if lower_is_better(key) else "< 0"  # the sign of a head whose removal hurts
        bar.set_label("normalised per layer, 0-1" if col == "importance"
                      else f"{key} ablated - intact ({helps}: the head helps)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return fig


def plot_pruning(agg: list[dict], key: str, path: Path, title: str, n_seeds: int, n_random: int):
    fig = new_figure(figsize=(6.5, 4.2))
    orders = f"{n_seeds * n_random}" + (f" ({n_seeds} checkpoints x {n_random})" if n_seeds > 1 else "")
    mean = f" (mean of {n_seeds} checkpoints)" if n_seeds > 1 else ""  # one checkpoint: its own curve
    ax = fig.add_subplot()
    xs = [100 * r["fraction"] for r in agg]
    ax.fill_between(xs, [r["random_p10"] for r in agg], [r["random_p90"] for r in agg], color="C7", alpha=0.3,
                    label=f"random orders: 10th-90th percentile of {orders}")
    ax.plot(xs, [r[f"random_{key}"] for r in agg], color="C7", linestyle="--", label="random orders (mean)")
    ax.plot(xs, [r[f"importance_{key}"] for r in agg], marker="o", color="C0",
            label=f"importance order{mean}")
    if agg[0].get(f"ablation_{key}") is not None:
        ax.plot(xs, [r[f"ablation_{key}"] for r in agg], marker="s", color="C3",
                label=f"single-head ablation order{mean}")
    if n_seeds > 1:
        ax.fill_between(xs, [r["importance_ci95_low"] for r in agg], [r["importance_ci95_high"] for r in agg],
                        color="C0", alpha=0.25, label="importance order, 95% CI over seeds")
    ax.set_xlabel("% of heads pruned")
    ax.set_ylabel(key + (" (lower is better)" if lower_is_better(key) else " (higher is better)"))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    ax.set_title(title, fontsize=9)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return fig


def ablate(checkpoints: list[Path], out: Path | None = None, importance_split: str = "validation",
           eval_split: str = "test", max_batches: int | None = 20, step: float = 0.1, n_random: int = 10,
           prune: bool = True, seed: int = 0, batch_size: int | None = None) -> dict[str, Any]:
    """Run everything and write the outputs; returns {"results", "pruning", "out"}."""
    check_number("--step", step, 0, 1, low_open=True)
    check_int("--random-orders", n_random, 0, 10_000)
    if max_batches is not None:
        check_int("--batches", max_batches, 1)
    if batch_size is not None:
        check_int("--batch-size", batch_size, 1)
    require_files(checkpoints)
    if out is None:  # inside a run someone else may have made: no link may carry the outputs elsewhere
        out = run_dir_of(checkpoints[0]) / "ablation"
        check_links(out, out.parent, "write the ablation there")
    results = [ablate_one(Path(c), importance_split, eval_split, max_batches, step, n_random, prune, seed, batch_size)
               for c in each_with_progress("ablate", checkpoints)]
    shapes = {(r["task"], r["n_layers"], r["n_heads"]) for r in results}
    if len(shapes) > 1:
        raise ConfigError(f"the checkpoints are of different tasks or shapes {sorted(shapes)}: give seeds of one "
                          "configuration")
    first = results[0]
    key = headline(first["base"])
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    metrics = list(first["base"])
    head_cols = ["checkpoint", "seed", "head", "layer", "index", "importance", "rank"] + \
        [f"{kind}_d{m}" for kind in ("zero", "mean") for m in metrics]
    all_heads = [{"checkpoint": r["checkpoint"], "seed": r["seed"], **h} for r in results for h in r["heads"]]
    write_csv(out / "heads.csv", head_cols, all_heads)
    short = ["head", "importance", "rank"] + [f"{kind}_d{m}" for kind in ("zero", "mean") for m in metrics]
    text = [f"# Single-head ablation\n\nTask {first['task']}; importance on the {importance_split} split, ablations "
            f"on the {eval_split} split. Δ = ablated minus full model (zero: head output set to 0; mean: replaced by "
            "its mean over the evaluation tokens). Importance: mean over examples of |dL/d gate|, normalised per "
            "layer (Michel et al. 2019); rank 1 = most important."]
    text += ["\n## Per layer, over checkpoints\n\nFor each checkpoint, the mean and the largest drop of zero-ablating "
             f"one head of the layer (`{key}`); then the mean over checkpoints with its 95% interval (exact: the sign-flip "
             "test inverted).\n",
             _md_table(layer_summary(results, key), ["layer", "n", "mean_d", "mean_d_ci95_low", "mean_d_ci95_high",
                                                     "worst_d", "worst_d_ci95_low", "worst_d_ci95_high"])]
    for r in results:
        base = ", ".join(f"{k} {v:.4f}" for k, v in r["base"].items())
        text += [f"\n## {r['checkpoint']} (seed {r['seed']})\n\nFull model: {base}.\n", _md_table(r["heads"], short)]
    (out / "heads.md").write_text("\n".join(text) + "\n")
    plot_heatmaps(all_heads, first["n_layers"], first["n_heads"], key, out / "ablation_heatmap.png", len(results))
    agg = aggregate_curves(results, key) if prune else []
    if agg:
        cols = ["fraction", "n_pruned", f"importance_{key}", "importance_ci95_low", "importance_ci95_high",
                f"ablation_{key}", f"random_{key}", "random_p10", "random_p90"] + \
            [f"{side}_{k}" for side in ("vs_random", "vs_ablation")
             for k in ("mean", "ci95_low", "ci95_high", "p", "p_holm", "verdict")]
        write_csv(out / "pruning.csv", cols, agg)
        better = "lower" if lower_is_better(key) else "higher"
        (out / "pruning.md").write_text(
            f"# Head pruning: importance order against random orders and the single-head ablation order\n\nTask {first['task']}; {len(results)} "
            f"checkpoint(s), {n_random} random orders each; {step:.0%} of the heads per step, importance re-estimated on "
            f"the {importance_split} split after each step; `{key}` on the {eval_split} split ({better} is better). "
            "vs_random = importance order minus the mean of the random orders, vs_ablation = importance order minus "
            "the single-head ablation order (heads ranked by what removing each alone costs on the "
            f"{importance_split} split); each paired by checkpoint (exact sign-flip test, 95% interval by inverting "
            "it), p Holm-adjusted over every level and both comparisons.\n\n" + _md_table(agg, cols) + "\n")
        plot_pruning(agg, key, out / "pruning_curve.png",
                     f"{first['task']}: iterative head pruning (Michel et al. 2019) vs random orders",
                     len(results), n_random)
    n_heads = first["n_layers"] * first["n_heads"]
    result = {"results": results, "pruning": agg, "comparisons": comparisons(agg, key, n_heads),
              "importance_split": importance_split, "eval_split": eval_split, "key": key}
    write_csv(out / "runs.csv", ["seed", "checkpoint", "in_verdicts", *ENV_COLUMNS],
              [{"seed": r["seed"], "checkpoint": r["checkpoint"], "in_verdicts": True, **r["environment"]}
               for r in results])
    (out / "ablation.json").write_text(json.dumps(result, indent=2))
    result["out"] = out
    return result


def ablate_command(o: AblateOptions) -> int:
    """`mhalab ablate`: `ablate` on the options, its tables printed."""
    if o.importance_split == o.eval_split:
        print(f"warning: importance and evaluation both on the {o.eval_split} split: the pruning curve is then "
              "judged on the data that ranked the heads", file=sys.stderr)
    r = ablate(o.checkpoints, o.out, o.importance_split, o.eval_split, o.batches or None, o.step, o.random_orders,
               o.prune, o.seed, o.batch_size)
    print((r["out"] / "heads.md").read_text())
    if r["pruning"]:
        print((r["out"] / "pruning.md").read_text())
    print(f"wrote {r['out']}")
    return 0


if __name__ == "__main__":
    from mhalab.cli import main

    main(["ablate", *sys.argv[1:]])
