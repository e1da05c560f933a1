"""Figures of attention heads: attention-map grids and layer x head statistic heatmaps.

Figures are built as `matplotlib.figure.Figure` objects and saved with the Agg canvas: no pyplot state, no
display and no global backend switch (safe to import from a notebook).
CLI: `python -m mhalab.plots <run_dir> [--out DIR]` redraws the heatmaps from <run_dir>/summary.json.
"""

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from mhalab.errors import ConfigError
from mhalab.stats import layer_head_matrix

def new_figure(**kwargs) -> Figure:
    """A matplotlib Figure with an Agg canvas attached (no display needed, pyplot's global state untouched).

    The canvas matters: a draw on a bare Figure (as seaborn's heatmap does to check tick labels) took ~6 GB of memory
    for an 8-panel attention grid; with Agg attached it takes ~30 MB.
    """
    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


# stats that live in [0, 1] share a fixed colour scale
_UNIT_STATS = {"entropy_norm", "confidence", "first_token", "self", "prev", "next"}


def attention_figure(weights_per_layer, tokens, max_tokens: int = 48, pad_token: str | None = None) -> Figure:
    """Grid of attention maps for one example: layers as rows, heads as columns, panels titled L{l}H{h}.

    weights_per_layer: one (H, T, T) tensor per layer. tokens: T strings; positions whose token equals
    `pad_token`, and positions past len(tokens), are dropped, then the first `max_tokens` are kept.
    """
    if not weights_per_layer:
        raise ValueError("weights_per_layer is empty")
    keep = [i for i, t in enumerate(tokens) if pad_token is None or t != pad_token][:max_tokens]
    labels = [str(tokens[i]) for i in keep]
    idx = torch.tensor(keep, dtype=torch.long)
    n_layers, n_heads = len(weights_per_layer), weights_per_layer[0].shape[0]
    n = len(keep)
    panel = min(4.5, max(2.5, 0.09 * n))  # inches per panel
    font = max(3.0, min(8.0, 300.0 / max(n, 1)))
    fig = new_figure(figsize=(panel * n_heads + 1.0, panel * n_layers + 0.6))
    axes = fig.subplots(n_layers, n_heads, squeeze=False)
    fig.subplots_adjust(left=0.04, right=0.99, bottom=0.09, top=0.92, wspace=0.12, hspace=0.22)  # (constrained layout: +0.5 s)
    for layer, w in enumerate(weights_per_layer):
        w = w.detach().float().cpu()[:, idx][:, :, idx]  # (H, n, n)
        for h in range(n_heads):
            ax = axes[layer, h]
            # each panel on its own scale, 0 to its largest weight (as seaborn's heatmap does by default): near-
            # uniform heads over long sequences have small weights everywhere and would vanish on a shared 0-1 scale.
            # imshow, not sns.heatmap: seaborn redraws the whole figure per panel to check tick labels (6 s for 8).
            vmax = max(float(w[h].max()), 1e-6)
            image = ax.imshow(w[h].numpy(), vmin=0.0, vmax=vmax, cmap="viridis", interpolation="nearest")
            ax.set_xticks(range(n), labels, rotation=90)
            ax.set_yticks(range(n), labels)
            colorbar = fig.colorbar(image, ax=ax, shrink=0.6, pad=0.02)
            colorbar.ax.tick_params(labelsize=6)
            ax.set_title(f"L{layer}H{h} (max {vmax:.2g})", fontsize=10)
            ax.tick_params(labelsize=font, length=0)
            ax.set_xlabel("key" if layer == n_layers - 1 else "")
            ax.set_ylabel("query" if h == 0 else "")
    fig.suptitle(f"attention weights, first {n} tokens (rows: queries, columns: keys; colour: weight)")
    return fig


def plot_attention_maps(weights_per_layer, tokens, path, max_tokens: int = 48, pad_token: str | None = None) -> Path:
    """Save the attention_figure grid (rows = query, columns = key) as a PNG; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    attention_figure(weights_per_layer, tokens, max_tokens, pad_token).savefig(path, dpi=100)
    return path


def stat_figure(table: dict[str, dict[str, float]], stat: str) -> Figure:
    """Annotated layer x head heatmap of one statistic (rows L0.., columns H0..)."""
    m = layer_head_matrix(table, stat).numpy()  # (n_layers, n_heads)
    n_layers, n_heads = m.shape
    fig = new_figure(figsize=(1.6 + 0.7 * n_heads, 1.0 + 0.5 * n_layers), layout="constrained")
    ax = fig.subplots()
    unit = stat in _UNIT_STATS
    cmap = "magma" if stat == "importance" else "viridis"
    lo, hi = (0.0, 1.0) if unit else (float(np.nanmin(m)), float(np.nanmax(m)))
    image = ax.imshow(m, cmap=cmap, vmin=lo, vmax=hi if hi > lo else lo + 1e-9, aspect="auto")
    fig.colorbar(image, ax=ax).formatter.set_useOffset(False)
    for (layer, head), value in np.ndenumerate(m):  # annotate each cell, dark text on light cells
        light = (value - lo) / ((hi - lo) or 1.0) > 0.6
        ax.text(head, layer, f"{value:.2f}", ha="center", va="center", fontsize=7, color="black" if light else "white")
    ax.set_xticks(range(n_heads), [f"H{h}" for h in range(n_heads)])
    ax.set_yticks(range(n_layers), [f"L{i}" for i in range(n_layers)])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title("head importance |dL/d gate|" if stat == "importance" else stat)
    ax.tick_params(axis="y", rotation=0)
    return fig


def plot_stat_heatmaps(table: dict[str, dict[str, float]], out_dir, stats=None) -> list[Path]:
    """Save one heatmap per statistic as out_dir/stat_{name}.png (plus stat_importance.png when present).

    stats: names to draw; None draws every statistic in the table.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    present = list(dict.fromkeys(k for row in table.values() for k in row))
    names = present if stats is None else list(stats)
    if "importance" in present and "importance" not in names:
        names.append("importance")
    paths = []
    for name in names:
        path = out_dir / f"stat_{name}.png"
        stat_figure(table, name).savefig(path, dpi=120)
        paths.append(path)
    return paths


def load_summary_table(run_dir) -> dict[str, dict[str, float]]:
    """Head table from <run_dir>/summary.json: "head_stats" merged with "head_importance" (as "importance")."""
    path = Path(run_dir) / "summary.json"
    if not path.is_file():
        raise ConfigError(f"cannot redraw plots: {path} does not exist (run training or evaluation first).")
    try:
        summary = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"cannot redraw plots: {path} is not valid JSON ({e}).") from e
    if not isinstance(summary.get("head_stats"), dict) or not summary["head_stats"]:
        raise ConfigError(f"cannot redraw plots: {path} has no 'head_stats' table.")
    table = {label: dict(row) for label, row in summary["head_stats"].items()}
    for label, value in (summary.get("head_importance") or {}).items():
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            table.setdefault(label, {})["importance"] = float(value)
    return table


def attention_maps_from_checkpoint(run_dir, out_dir, checkpoint=None, max_tokens: int = 48) -> Path:
    """Redraw the probe example's attention maps from a checkpoint of a run (default: its best, else last.ckpt).

    The data task comes from the run's saved config; the checkpoint is loaded with weights_only=True.
    """
    from mhalab.checkpoint import build_data, load_module, load_run_config

    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir / "checkpoints" / "last.ckpt", run_dir)
    if checkpoint is None:
        best = ((cfg.get("_summary") or {}).get("checkpoints") or {}).get("best")
        checkpoint = best if best and Path(best).is_file() else run_dir / "checkpoints" / "last.ckpt"
    module = load_module(checkpoint)
    dm = build_data(cfg)
    probe = dm.probe_batch((cfg.get("stats") or {}).get("probe_size", 8))
    with torch.no_grad():
        attentions = module(probe, need_weights=True).attentions  # n_layers x (B, H, T, T)
    n_valid = int((~probe["padding_mask"][0]).sum())
    tokens = dm.decode(probe["input_ids"][0, :n_valid].tolist())
    maps = [w[0, :, :n_valid, :n_valid] for w in attentions]
    return plot_attention_maps(maps, tokens, Path(out_dir) / "attention_maps.png", max_tokens=max_tokens)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mhalab.plots",
                                description="Redraw a run's pictures: head-statistic heatmaps from summary.json, and "
                                            "attention maps of the probe example from a checkpoint.")
    p.add_argument("run_dir", type=Path, help="run directory holding summary.json")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: <run_dir>/plots)")
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="checkpoint for the attention maps (default: the run's best, else checkpoints/last.ckpt)")
    p.add_argument("--no-maps", action="store_true", help="only the statistic heatmaps, no checkpoint needed")
    p.add_argument("--max-tokens", type=int, default=48, help="tokens shown in the attention maps")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    out = args.out if args.out is not None else args.run_dir / "plots"
    try:
        paths = plot_stat_heatmaps(load_summary_table(args.run_dir), out)
        has_ckpt = args.checkpoint is not None or (args.run_dir / "checkpoints").is_dir()
        if not args.no_maps and has_ckpt:
            paths.append(attention_maps_from_checkpoint(args.run_dir, out, args.checkpoint, args.max_tokens))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
