"""Figures of attention heads: attention-map grids and layer x head statistic heatmaps.

Figures are built as `matplotlib.figure.Figure` objects and saved with the Agg canvas: no pyplot state, no
display and no global backend switch (safe to import from a notebook).
CLI: `mhalab plots <run_dir> [--out DIR]` redraws a run's pictures into a new folder (default
<run_dir>/plots-redrawn-<time>): the heatmaps from its summary.json, the attention maps from its checkpoint.
"""

from datetime import datetime
from pathlib import Path

from mhalab.errors import ConfigError

def new_figure(**kwargs):
    """A matplotlib Figure with an Agg canvas attached (no display needed, pyplot's global state untouched).

    The canvas matters: a draw on a bare Figure (as seaborn's heatmap does to check tick labels) took ~6 GB of memory
    for an 8-panel attention grid; with Agg attached it takes ~30 MB.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


# stats that live in [0, 1] share a fixed colour scale
_UNIT_STATS = {"entropy_norm", "confidence", "first_token", "self", "prev", "next"}


def attention_figure(weights_per_layer, tokens, max_tokens: int = 48, pad_token: str | None = None):
    """Grid of attention maps for one example: layers as rows, heads as columns, panels titled L{l}H{h}.

    weights_per_layer: one (H, T, T) tensor per layer. tokens: T strings; positions whose token equals
    `pad_token`, and positions past len(tokens), are dropped, then the first `max_tokens` are kept.
    """
    import torch

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
            shown = tick_positions(n, panel)
            ax.set_xticks(shown, [labels[i] for i in shown], rotation=90)
            ax.set_yticks(shown, [labels[i] for i in shown])
            colorbar = fig.colorbar(image, ax=ax, shrink=0.6, pad=0.02)
            colorbar.ax.tick_params(labelsize=6)
            ax.set_title(f"L{layer}H{h} (max {vmax:.2g})", fontsize=10)
            ax.tick_params(labelsize=font, length=0)
            ax.set_xlabel("key" if layer == n_layers - 1 else "")
            ax.set_ylabel("query" if h == 0 else "")
    fig.suptitle(f"attention weights, first {n} tokens (rows: queries, columns: keys; colour: weight)")
    return fig


def tick_positions(n: int, inches: float, per_inch: float = 9.0) -> list[int]:
    """Every k-th of n positions, k chosen so at most `per_inch` labels share an inch of axis (none overlap)."""
    step = max(1, -(-n // max(1, int(inches * per_inch))))
    return list(range(0, n, step))


def plot_attention_maps(weights_per_layer, tokens, path, max_tokens: int = 48, pad_token: str | None = None) -> Path:
    """Save the attention_figure grid (rows = query, columns = key) as a PNG; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    attention_figure(weights_per_layer, tokens, max_tokens, pad_token).savefig(path, dpi=100)
    return path


def stat_figure(matrix, stat: str):
    """Annotated layer x head heatmap of one statistic, a (n_layers, n_heads) tensor (rows L0.., columns H0..)."""
    import numpy as np

    m = matrix.detach().float().cpu().numpy() if hasattr(matrix, "detach") else np.asarray(matrix, dtype=float)
    n_layers, n_heads = m.shape
    fig = new_figure(figsize=(max(3.2, 1.6 + 0.7 * n_heads), 1.3 + 0.5 * n_layers), layout="constrained")
    ax = fig.subplots()
    unit = stat in _UNIT_STATS or stat == "importance"  # importance is normalised per layer: within [0, 1]
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
    ax.set_title("importance E|dL/d gate|\nnormalised per layer" if stat == "importance" else stat, fontsize=8)
    return fig


def plot_stat_heatmaps(matrices: dict, out_dir, stats=None) -> list[Path]:
    """Save one heatmap per statistic, {name: (n_layers, n_heads)}, as out_dir/stat_{name}.png.

    stats: names to draw; None draws every one.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in (list(matrices) if stats is None else list(stats)):
        path = out_dir / f"stat_{name}.png"
        stat_figure(matrices[name], name).savefig(path, dpi=120)
        paths.append(path)
    return paths


def summary_matrices(summary) -> dict:
    """{stat: (n_layers, n_heads) tensor} of a RunSummary: its head statistics and (as "importance") importance."""
    from mhalab.runs.summary import head_matrix

    matrices = {name: head_matrix(rows) for name, rows in summary.head_stats.items()}
    if summary.head_importance is not None:
        matrices["importance"] = head_matrix(summary.head_importance)
    return matrices


def attention_maps_from_checkpoint(run_dir, out_dir, checkpoint=None, max_tokens: int = 48) -> Path:
    """Redraw the probe example's attention maps from a checkpoint of a run (default: the one it tested).

    The data task comes from the run's summary.json; the checkpoint is loaded with weights_only=True.
    """
    from mhalab.analysis.head_stats import attention_patterns
    from mhalab.analysis.run import open_run

    run = open_run(run_dir, checkpoint)
    module, dm = run.module, run.data
    probe = dm.probe_batch(run.summary.config.get("stats", {}).get("probe_size", 8))
    attentions = attention_patterns(module, probe)  # n_layers x (B, H, T, T)
    n_valid = int((~probe["padding_mask"][0]).sum())
    tokens = dm.decode(probe["input_ids"][0, :n_valid].tolist())
    maps = [w[0, :, :n_valid, :n_valid] for w in attentions]
    return plot_attention_maps(maps, tokens, Path(out_dir) / "attention_maps.png", max_tokens=max_tokens)


def run_cli(args) -> int:
    """`mhalab plots`: the heatmaps from summary.json and, unless --no-maps, the attention maps, in a new folder."""
    from mhalab.checks import check_int
    from mhalab.config.writes import check_links
    from mhalab.runs.summary import read_summary

    out = args.out if args.out is not None else args.run_dir / f"plots-redrawn-{datetime.now():%Y%m%d-%H%M%S}"
    check_int("--max-tokens", args.max_tokens, 2, 512)
    if out.resolve() == (args.run_dir / "plots").resolve():
        raise ConfigError(f"--out {out}: that is where training drew its pictures; choose a new folder")
    if args.out is None:  # inside a run someone else may have made: no link may carry the pictures elsewhere
        check_links(out, args.run_dir, "draw the pictures there")
    summary = read_summary(args.run_dir)
    if not summary.head_stats:
        raise ConfigError(f"cannot redraw plots: {args.run_dir}/summary.json has no head statistics")
    from mhalab.training.console import each_with_progress

    matrices = summary_matrices(summary)
    # the attention maps first: they read the run's checkpoint and rebuild its data, which may be refused
    pictures = ([] if args.no_maps else ["attention maps"]) + [f"heatmap of {name}" for name in matrices]
    paths = []
    for picture in each_with_progress("plots", pictures, "picture"):  # a line on stderr as each one starts
        if picture == "attention maps":
            paths.append(attention_maps_from_checkpoint(args.run_dir, out, args.checkpoint, args.max_tokens))
        else:
            paths += plot_stat_heatmaps(matrices, out, stats=[picture.removeprefix("heatmap of ")])
    paths.append(write_head_table(summary, out / "head_stats.md", args.run_dir))
    for path in paths:
        print(path)
    return 0


def write_head_table(summary, path: Path, run_dir: Path) -> Path:
    """The run's per-head statistics and importance (its summary.json's last probe pass) as one Markdown table,
    a row per head L{layer}H{head}."""
    from mhalab.tables import Table, fmt

    matrices = summary_matrices(summary)
    table = Table(["head", *matrices])
    n_layers, n_heads = next(iter(matrices.values())).shape
    for layer in range(n_layers):
        for head in range(n_heads):
            table.add([f"L{layer}H{head}", *(fmt(float(m[layer, head]), 3) for m in matrices.values())])
    metrics = ", ".join(f"{k} {v:.4f}" for k, v in sorted(summary.metrics.items())
                        if k.startswith("val/") and v is not None)
    path.write_text(f"# Head statistics of {run_dir.name}\n\n{summary.task} ({summary.objective}), {metrics}; the "
                    f"last probe pass of training (summary.json), drawn by `mhalab plots`\n\n{table.markdown()}\n")
    return path


def main(argv: list[str] | None = None) -> None:
    from mhalab.cli import command_main

    command_main("plots", argv)


if __name__ == "__main__":
    main()
