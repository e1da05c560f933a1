"""Pictures of heads: attention-map grids with readable ticks, (layer, head) heatmaps on fixed scales, and the CLI
that redraws a run's pictures into a new folder from its summary and checkpoint."""

import json
import re
import subprocess
import sys

import pytest
import torch

from mhalab.cli import main
from mhalab.pictures import attention_figure, plot_attention_maps, plot_stat_heatmaps, stat_figure

PNG = b"\x89PNG\r\n\x1a\n"


def is_png(path):
    data = path.read_bytes()
    return len(data) > 1000 and data.startswith(PNG)


def probe(n_layers=2, n_heads=3, T=6):
    return [torch.softmax(torch.randn(n_heads, T, T), dim=-1) for _ in range(n_layers)]


def test_attention_figure_grid():
    tokens = ["the", "cat", "sat", "down", "<pad>", "<pad>"]
    fig = attention_figure(probe(), tokens, pad_token="<pad>")
    panels = [ax for ax in fig.axes if re.fullmatch(r"L\dH\d", ax.get_title())]
    assert [ax.get_title() for ax in panels] == [f"L{l}H{h}" for l in range(2) for h in range(3)]
    assert [t.get_text() for t in panels[0].get_yticklabels()] == tokens[:4]  # padding skipped
    assert [t.get_text() for t in panels[3].get_xticklabels()] == tokens[:4]  # keys under each column's lowest panel
    assert len(attention_figure(probe(1, 2), tokens, max_tokens=3).axes[0].get_yticklabels()) == 3


def test_long_maps_label_every_token():
    tokens = [f"t{i}" for i in range(32)]
    fig = attention_figure(probe(1, 2, 32), tokens)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == tokens
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == tokens


def test_plot_attention_maps_writes_png(tmp_path):
    path = plot_attention_maps(probe(), list("abcdef"), tmp_path / "maps" / "attn.png")
    assert path == tmp_path / "maps" / "attn.png" and is_png(path)


def test_heatmaps_of_layer_by_head_matrices(tmp_path):
    matrices = {"entropy": torch.rand(2, 3) * 3, "self": torch.rand(2, 3), "importance": torch.rand(2, 3)}
    paths = plot_stat_heatmaps(matrices, tmp_path)
    assert [p.name for p in paths] == ["stat_entropy.png", "stat_self.png", "stat_importance.png"]
    assert all(is_png(p) for p in paths)
    fig = stat_figure(matrices["importance"], "importance")
    image = fig.axes[0].images[0]
    assert image.get_clim() == (0.0, 1.0)  # importance is normalised per layer: the scale starts at 0
    assert "normalised per layer" in fig.axes[0].get_title()


def test_cli_redraws_a_run_into_a_new_folder_and_keeps_the_training_pictures(tiny_runs, tmp_path, capsys):
    run = tiny_runs[0]
    assert not (run / "plots").exists()  # the tiny runs draw none; a training folder must never be overwritten
    main(["plots", str(run), "--out", str(tmp_path / "figs")])
    names = sorted(p.name for p in (tmp_path / "figs").iterdir() if p.suffix == ".png")
    assert "attention_maps.png" in names and "stat_importance.png" in names and "stat_entropy.png" in names
    assert all(is_png(tmp_path / "figs" / n) for n in names)
    table = (tmp_path / "figs" / "head_stats.md").read_text().splitlines()  # a row per head, a column per statistic
    heads = json.loads((run / "summary.json").read_text())["head_stats"]["entropy"]
    assert "| head | entropy |" in table[4] and table[6].startswith("| L0H0 |")
    shown = json.loads((run / "summary.json").read_text())["metrics"]  # every val metric, a zero one too
    assert all(f"{k} {v:.4f}" in table[2] for k, v in shown.items() if k.startswith("val/") and v is not None)
    assert len(table) == 6 + len(heads) * len(heads[0])
    err = capsys.readouterr().err  # a line as each picture starts: a slow redraw is never silent
    assert f"plots: picture 1/{len(names)} (0 s so far): attention maps" in err  # first: it rebuilds the data
    assert f"plots: picture {len(names)}/{len(names)}" in err and "heatmap of " in err.rstrip().splitlines()[-1]
    with pytest.raises(SystemExit) as e:
        main(["plots", str(run), "--out", str(run / "plots")])
    assert e.value.code == 2 and "where training drew its pictures" in capsys.readouterr().err


def test_cli_missing_summary_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["plots", str(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and str(tmp_path / "summary.json") in err and err.count("\n") == 1


@pytest.mark.proc
def test_attention_grid_stays_small_in_memory():
    """seaborn draws the figure to check tick labels; on a canvas-less Figure that cost ~6 GB for 8 panels."""
    code = ("import resource, torch\nfrom mhalab.pictures import attention_figure\n"
            "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "attention_figure([torch.rand(4, 48, 48).softmax(-1) for _ in range(2)], [f't{i}' for i in range(48)])\n"
            "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) // 1024)")
    grew_mib = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert grew_mib < 500
