import json
import re

import torch

from mhalab.plots import attention_figure, main, plot_attention_maps, plot_stat_heatmaps
from mhalab.stats import head_stats, stats_table

PNG = b"\x89PNG\r\n\x1a\n"


def is_png(path):
    data = path.read_bytes()
    return len(data) > 1000 and data.startswith(PNG)


def probe(n_layers=2, n_heads=3, T=6):
    return [torch.softmax(torch.randn(n_heads, T, T), dim=-1) for _ in range(n_layers)]


def test_attention_figure_grid():
    tokens = ["the", "cat", "sat", "down", "<pad>", "<pad>"]
    fig = attention_figure(probe(), tokens, pad_token="<pad>")
    panels = [ax for ax in fig.axes if re.match(r"L\dH\d \(max ", ax.get_title())]
    assert [ax.get_title().split()[0] for ax in panels] == [f"L{l}H{h}" for l in range(2) for h in range(3)]
    labels = [t.get_text() for t in panels[0].get_xticklabels()]
    assert labels == tokens[:4]  # padding skipped
    assert len(attention_figure(probe(1, 2), tokens, max_tokens=3).axes[0].get_yticklabels()) == 3


def test_plot_attention_maps_writes_png(tmp_path):
    path = plot_attention_maps(probe(), list("abcdef"), tmp_path / "maps" / "attn.png")
    assert path == tmp_path / "maps" / "attn.png" and is_png(path)


def test_plot_stat_heatmaps(tmp_path):
    table = stats_table([head_stats(torch.softmax(torch.randn(2, 3, 5, 5), -1)) for _ in range(2)])
    for h, label in enumerate(table):
        table[label]["importance"] = h / 6
    paths = plot_stat_heatmaps(table, tmp_path, stats=["entropy", "self"])
    assert [p.name for p in paths] == ["stat_entropy.png", "stat_self.png", "stat_importance.png"]
    assert all(is_png(p) for p in paths)


def test_cli_redraws_from_summary(tmp_path, capsys):
    summary = {
        "head_stats": {f"L{l}H{h}": {"entropy": 1.0 + h, "prev": 0.1 * l} for l in range(2) for h in range(2)},
        "head_importance": {f"L{l}H{h}": 0.5 for l in range(2) for h in range(2)},
    }
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert main([str(tmp_path), "--out", str(tmp_path / "figs")]) == 0
    names = sorted(p.name for p in (tmp_path / "figs").iterdir())
    assert names == ["stat_entropy.png", "stat_importance.png", "stat_prev.png"]
    assert all(is_png(tmp_path / "figs" / n) for n in names)
    assert capsys.readouterr().out.count(".png") == 3


def test_cli_missing_summary_exits_2(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2  # `python -m mhalab.plots` does sys.exit(main())
    err = capsys.readouterr().err
    assert str(tmp_path / "summary.json") in err and err.count("\n") == 1
    assert not (tmp_path / "plots").exists()


def test_attention_grid_stays_small_in_memory():
    """seaborn draws the figure to check tick labels; on a canvas-less Figure that cost ~6 GB for 8 panels."""
    import subprocess
    import sys

    code = ("import resource, torch\nfrom mhalab.plots import attention_figure\n"
            "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "attention_figure([torch.rand(4, 48, 48).softmax(-1) for _ in range(2)], [f't{i}' for i in range(48)])\n"
            "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) // 1024)")
    grew_mib = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert grew_mib < 500
