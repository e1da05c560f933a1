"""Pictures of attention heads, for every layer to draw with: attention-map grids, layer x head statistic heatmaps,
figures rendered to arrays for the loggers, and `new_figure` (the one way mhalab makes a figure).

Figures are built as `matplotlib.figure.Figure` objects and saved with the Agg canvas: no pyplot state, no
display and no global backend switch (safe to import from a notebook).
"""

import textwrap
from pathlib import Path


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


def log_dodge(i: int, n: int, step: float = 0.03) -> float:
    """The factor that places the i-th of n series side by side around a shared x on a log axis (x * factor), so
    that equal values stay visible: 1 for a single series, steps of `step` (a fraction of x) around 1."""
    return 1 + step * (i - (n - 1) / 2)


# stats in [0, 1] (masses, scores, importance normalised per layer) share a fixed 0-1 colour scale; the others
# start at 0 and carry their unit
_UNIT_STATS = {"entropy_norm", "confidence", "first_token", "self", "prev", "next", "prev_token_score",
               "duplicate_token_score", "induction_score", "importance"}
_UNITS = {"entropy": "nats", "distance": "tokens", "argmax_distance": "tokens"}
_TITLES = {"importance": "importance E|dL/d gate|, normalised per layer",
           "distance": "distance: expected |i - j|", "argmax_distance": "argmax_distance: to the largest weight",
           "entropy_norm": "entropy_norm: entropy / ln(keys), 1 = uniform",
           "confidence": "confidence: a query's largest weight", "first_token": "first_token: weight on position 0",
           "self": "self: weight on the query's own position", "prev": "prev: weight on the previous position",
           "next": "next: weight on the next position", "prev_token_score": "prev_token_score (random tokens)",
           "duplicate_token_score": "duplicate_token_score (random tokens)",
           "induction_score": "induction_score (random repeated tokens)"}
MAX_COLUMNS = 4  # panels per row of an attention-map grid


def token_text(token, width: int = 6) -> str:
    """A token as a tick label: whitespace made visible (space ␣, newline ⏎, tab ⇥), cut to `width` characters."""
    text = str(token).replace(" ", "\u2423").replace("\n", "\u23ce").replace("\t", "\u21e5").replace("\r", "")
    return text if len(text) <= width else text[:width - 1] + "\u2026"


def head_rows(n_heads: int, n_kv_heads: int | None = None, max_columns: int = MAX_COLUMNS) -> list[tuple[str, list]]:
    """The rows of one layer's grid: (label, query heads). GQA/MQA (n_kv_heads < n_heads): one row (or more, at
    most `max_columns` heads each) per key-value group, labelled 'KV head g'; MHA: the heads in rows of max_columns."""
    from mhalab.heads import kv_head_of

    if not n_kv_heads or n_kv_heads == n_heads:
        groups = [("", list(range(n_heads)))]
    else:
        groups = [(f"KV head {g}", [h for h in range(n_heads) if kv_head_of(h, n_heads, n_kv_heads) == g])
                  for g in range(n_kv_heads)]
    return [(label, heads[i:i + max_columns]) for label, heads in groups for i in range(0, len(heads), max_columns)]


def attention_figure(weights_per_layer, tokens, max_tokens: int = 32, pad_token: str | None = None,
                     n_kv_heads: int | None = None):
    """Grid of attention maps for one example, a panel per head titled L{l}H{h}, every token labelled.

    weights_per_layer: one (H, T, T) tensor per layer. tokens: T strings; positions whose token equals
    `pad_token`, and positions past len(tokens), are dropped, then the first `max_tokens` are kept. Each layer's
    heads fill rows of at most MAX_COLUMNS; with n_kv_heads < H a row holds one key-value group (labelled).
    Colour: each query row divided by its largest weight (1 = where that query looks most), on one 0-1 scale for
    all panels: a raw 0-1 scale is saturated by the first rows of a causal model, which have few keys to share.
    """
    import numpy as np
    import torch

    if not weights_per_layer:
        raise ValueError("weights_per_layer is empty")
    keep = [i for i, t in enumerate(tokens) if pad_token is None or t != pad_token][:max_tokens]
    labels = [token_text(tokens[i]) for i in keep]
    idx = torch.tensor(keep, dtype=torch.long)
    n_heads = weights_per_layer[0].shape[0]
    rows = [(layer, label, heads) for layer in range(len(weights_per_layer))
            for label, heads in head_rows(n_heads, n_kv_heads)]
    n_cols = max(len(heads) for _, _, heads in rows)
    n = len(keep)
    # a causal model: no weight above the diagonal in any head of any layer
    causal = all(bool((w.detach()[:, idx][:, :, idx].triu(1) == 0).all()) for w in weights_per_layer)
    panel = max(1.6, 0.13 * n)  # inches per panel: 0.13 in per token, room for a 7-point label each
    # a fixed layout in inches (constrained layout took half the drawing time): tokens label the left column's
    # queries and the keys under each column's lowest panel; a title's height between rows
    left, right, top, bottom, gap_w, gap_h = 0.8, 1.0, 0.8, 0.7, 0.15, 0.35
    width = left + n_cols * panel + (n_cols - 1) * gap_w + right
    height = top + len(rows) * panel + (len(rows) - 1) * gap_h + bottom
    fig = new_figure(figsize=(width, height))
    axes = fig.subplots(len(rows), n_cols, squeeze=False, gridspec_kw=dict(
        left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height,
        wspace=gap_w / panel, hspace=gap_h / panel))
    image = None
    for r, (layer, group, heads) in enumerate(rows):
        w = weights_per_layer[layer].detach().float().cpu()[:, idx][:, :, idx]  # (H, n, n)
        w = w / w.amax(-1, keepdim=True).clamp_min(1e-9)  # (H, n, n): each row over its largest weight
        for c in range(n_cols):
            ax = axes[r, c]
            if c >= len(heads):
                ax.set_axis_off()
                continue
            h = heads[c]
            # imshow, not sns.heatmap: seaborn redraws the whole figure per panel to check tick labels (6 s for 8)
            # keys a query cannot see (causal) masked: blank, not the colour of a zero weight
            shown = np.ma.masked_array(w[h].numpy(), mask=np.triu(np.ones((n, n), bool), 1) if causal else False)
            image = ax.imshow(shown, vmin=0.0, vmax=1.0, cmap="viridis", interpolation="nearest")
            # the diagonal (self) crosses its cells; the previous token's band lies just left of it, untouched
            ax.plot([-0.5, n - 0.5], [-0.5, n - 0.5], color="white", lw=0.6, alpha=0.7)
            lowest = r == len(rows) - 1 or c >= len(rows[r + 1][2])
            ax.set_xticks(range(n), labels if lowest else [], rotation=90, fontsize=7)
            ax.set_yticks(range(n), labels if c == 0 else [], fontsize=7)
            ax.tick_params(length=0, pad=1)
            ax.set_title(f"L{layer}H{h}" + (f" ({group})" if group else ""), fontsize=11, pad=3)
            if c == 0:
                ax.set_ylabel("query", fontsize=8, labelpad=1)
            if lowest:
                ax.set_xlabel("key", fontsize=8, labelpad=1)
    bar = fig.add_axes([1 - (right - 0.2) / width, bottom / height, 0.15 / width,
                        min(panel, height - top - bottom) / height])
    colorbar = fig.colorbar(image, cax=bar)
    colorbar.set_label("weight / the row's largest weight", fontsize=9)
    colorbar.ax.tick_params(labelsize=8)
    fig.suptitle(f"attention weights, first {n} tokens (rows: queries, columns: keys)\ncolour: each query's "
                 "weights divided by its largest (1 = where that query looks most); white line: the diagonal (self)"
                 + ("; blank: keys a query cannot see" if causal else ""), fontsize=11, y=1 - 0.1 / height, va="top")
    return fig


def plot_attention_maps(weights_per_layer, tokens, path, max_tokens: int = 32, pad_token: str | None = None,
                        n_kv_heads: int | None = None) -> Path:
    """Save the attention_figure grid (rows = query, columns = key) as a PNG; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    attention_figure(weights_per_layer, tokens, max_tokens, pad_token, n_kv_heads).savefig(path, dpi=100)
    return path


def cell_decimals(m) -> int:
    """Decimals that tell a heatmap's cells apart: 2, or more (up to 4) when their values are closer than 0.01."""
    import numpy as np

    values = np.unique(np.round(m[np.isfinite(m)], 6))
    if len(values) < 2:
        return 2
    gap = float(np.min(np.diff(values)))
    return int(min(4, max(2, np.ceil(-np.log10(gap)))))


def stat_scale(stat: str, m) -> tuple[float, float, str]:
    """(low, high, what the colour bar says) of a statistic's heatmap: 0-1 for masses, scores and importance; from
    0 to the largest value, with its unit, otherwise."""
    import numpy as np

    if stat in _UNIT_STATS:
        return 0.0, 1.0, "fixed scale 0-1"
    high = float(np.nanmax(m)) if np.isfinite(m).any() else 1.0
    low = min(0.0, float(np.nanmin(m)))
    unit = _UNITS.get(stat)
    return low, high if high > low else low + 1.0, f"{unit}, from 0" if unit else "from 0"


def stat_figure(matrix, stat: str):
    """Annotated layer x head heatmap of one statistic, a (n_layers, n_heads) tensor (rows L0.., columns H0..), on
    the statistic's fixed scale (stat_scale), each cell's value printed to the decimals that tell cells apart."""
    import numpy as np

    m = matrix.detach().float().cpu().numpy() if hasattr(matrix, "detach") else np.asarray(matrix, dtype=float)
    n_layers, n_heads = m.shape
    fig = new_figure(figsize=(max(3.6, 1.9 + 0.75 * n_heads), 1.5 + 0.5 * n_layers), layout="constrained")
    ax = fig.subplots()
    lo, hi, scale = stat_scale(stat, m)
    image = ax.imshow(m, cmap="magma" if stat == "importance" else "viridis", vmin=lo, vmax=hi, aspect="auto")
    colorbar = fig.colorbar(image, ax=ax)
    colorbar.formatter.set_useOffset(False)
    colorbar.set_label(scale, fontsize=8)
    colorbar.ax.tick_params(labelsize=8)
    decimals = cell_decimals(m)
    for (layer, head), value in np.ndenumerate(m):  # annotate each cell, dark text on light cells
        light = (value - lo) / (hi - lo) > 0.6
        ax.text(head, layer, f"{value:.{decimals}f}", ha="center", va="center", fontsize=7,
                color="black" if light else "white")
    ax.set_xticks(range(n_heads), [f"H{h}" for h in range(n_heads)], fontsize=8)
    ax.set_yticks(range(n_layers), [f"L{i}" for i in range(n_layers)], fontsize=8)
    ax.set_xlabel("head", fontsize=8)
    ax.set_ylabel("layer", fontsize=8)
    title = _TITLES.get(stat, stat) + (f" ({_UNITS[stat]})" if stat in _UNITS else "")  # what the cells are
    ax.set_title(textwrap.fill(title, int(fig.get_figwidth() * 12)), fontsize=10)  # ~12 characters an inch
    return fig


def drawn_stats(matrices: dict, causal: bool) -> list[str]:
    """The statistics worth a picture: all but `next` in a causal model (a query never sees the next key: 0)."""
    return [name for name in matrices if not (causal and name == "next")]


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


LOGGED_WIDTH = 1200  # pixels, at most, of a picture sent to a logger while training
LOGGED_STATS = ("entropy_norm", "prev", "first_token", "induction_score")  # heatmaps sent while training


def figure_array(fig, max_width: int = LOGGED_WIDTH):
    """A figure rendered to a (height, width, 3) uint8 array at most max_width pixels wide (at most 100 dpi)."""
    import numpy as np

    fig.set_dpi(min(100.0, max_width / fig.get_figwidth()))
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()


def training_pictures(matrices: dict, maps, tokens, max_tokens: int = 32, n_kv_heads: int | None = None) -> dict:
    """{name: image array} of one statistics pass for the loggers: the attention maps and LOGGED_STATS' heatmaps."""
    images = {"attention_maps": figure_array(attention_figure(maps, tokens, max_tokens, None, n_kv_heads))}
    for name in LOGGED_STATS:
        if name in matrices:
            images[f"stat_{name}"] = figure_array(stat_figure(matrices[name], name))
    return images
