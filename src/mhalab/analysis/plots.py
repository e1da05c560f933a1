"""`mhalab plots <run_dir> [--out DIR] [--html]`: redraw a run's pictures into a new folder (default
<run_dir>/plots-redrawn-<time>): the heatmaps from its summary.json, the attention maps from its checkpoint, and
with --html the interactive page of every head (attention.html, mhalab.attention_page). The drawing itself is
`mhalab.pictures`.
"""

from datetime import datetime
from pathlib import Path

from mhalab.analysis.options import PlotsOptions
from mhalab.errors import ConfigError
from mhalab.pictures import drawn_stats, plot_attention_maps, plot_stat_heatmaps


def summary_matrices(summary) -> dict:
    """{stat: (n_layers, n_heads) tensor} of a RunSummary: its head statistics and (as "importance") importance."""
    from mhalab.runs.summary import head_matrix

    matrices = {name: head_matrix(rows) for name, rows in summary.head_stats.items()}
    if summary.head_importance is not None:
        matrices["importance"] = head_matrix(summary.head_importance)
    return matrices


def probe_example(run_dir, checkpoint=None):
    """(weights n_layers x (H, T, T), T tokens, the module) of the probe batch's first example under a checkpoint of
    a run (default: the one it tested), padding left out. The checkpoint is loaded with weights_only=True."""
    from mhalab.head_statistics import attention_patterns
    from mhalab.analysis.run import open_run

    run = open_run(run_dir, checkpoint)
    module, dm = run.module, run.data
    probe = dm.probe_batch(run.summary.config.get("stats", {}).get("probe_size", 8))
    attentions = attention_patterns(module, probe)  # n_layers x (B, H, T, T)
    n_valid = int((~probe["padding_mask"][0]).sum())
    tokens = dm.decode(probe["input_ids"][0, :n_valid].tolist())
    return [w[0, :, :n_valid, :n_valid] for w in attentions], tokens, module  # n_layers x (H, T, T)


def attention_maps_from_checkpoint(run_dir, out_dir, checkpoint=None, max_tokens: int = 32) -> Path:
    """Redraw the probe example's attention maps from a checkpoint of a run (default: the one it tested)."""
    maps, tokens, module = probe_example(run_dir, checkpoint)
    arch = module.arch
    return plot_attention_maps(maps, tokens, Path(out_dir) / "attention_maps.png", max_tokens,
                               n_kv_heads=arch.attention.n_kv_heads)


def attention_page_from_checkpoint(run_dir, out_dir, matrices: dict, checkpoint=None) -> Path:
    """The interactive page of every head (mhalab.attention_page) of the probe example, as attention.html."""
    from mhalab.attention_page import write_attention_page

    maps, tokens, module = probe_example(run_dir, checkpoint)
    arch = module.arch
    matrices = {k: matrices[k] for k in drawn_stats(matrices, arch.causal)}  # none zero by construction
    return write_attention_page(Path(out_dir) / "attention.html", maps, tokens, matrices, f"attention of every head: "
                                f"{Path(run_dir).name}", arch.attention.n_kv_heads)


def plots_command(o: PlotsOptions) -> int:
    """`mhalab plots`: the heatmaps from summary.json and, unless --no-maps, the attention maps, and with --html the
    interactive page of every head, in a new folder."""
    from mhalab.checks import check_int
    from mhalab.config.writes import check_links
    from mhalab.runs.summary import read_summary

    out = o.out if o.out is not None else o.run_dir / f"plots-redrawn-{datetime.now():%Y%m%d-%H%M%S}"
    check_int("--max-tokens", o.max_tokens, 2, 512)
    if out.resolve() == (o.run_dir / "plots").resolve():
        raise ConfigError(f"--out {out}: that is where training drew its pictures; choose a new folder")
    if o.out is None:  # inside a run someone else may have made: no link may carry the pictures elsewhere
        check_links(out, o.run_dir, "draw the pictures there")
    summary = read_summary(o.run_dir)
    if not summary.head_stats:
        raise ConfigError(f"cannot redraw plots: {o.run_dir}/summary.json has no head statistics")
    from mhalab.training.console import each_with_progress

    matrices = summary_matrices(summary)
    # the attention maps first: they read the run's checkpoint and rebuild its data, which may be refused
    pictures = ["attention maps"] if o.maps else []
    pictures += [f"heatmap of {name}" for name in drawn_stats(matrices, summary.objective == "clm")]
    pictures += ["interactive page"] if o.html else []
    paths = []
    for picture in each_with_progress("plots", pictures, "picture"):  # a line on stderr as each one starts
        if picture == "attention maps":
            paths.append(attention_maps_from_checkpoint(o.run_dir, out, o.checkpoint, o.max_tokens))
        elif picture == "interactive page":
            paths.append(attention_page_from_checkpoint(o.run_dir, out, matrices, o.checkpoint))
        else:
            paths += plot_stat_heatmaps(matrices, out, stats=[picture.removeprefix("heatmap of ")])
    paths.append(write_head_table(summary, out / "head_stats.md", o.run_dir))
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


if __name__ == "__main__":
    import sys

    from mhalab.cli import main

    main(["plots", *sys.argv[1:]])
