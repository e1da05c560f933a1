"""mhalab.ablate: single-head zero/mean ablation, importance ranking and the iterative pruning curve."""

import csv
import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import TINY

from mhalab.ablate import (MeanAblation, eval_batches, evaluate, main,
                           pruning_curve, single_head_ablation)
from mhalab.checkpoint import build_data, load_module, load_run_config


def tiny_checkpoint(tmp_path_factory) -> str:
    """A tiny 2-layer, 4-head classifier trained for 3 steps; trained once per test session (test_convert too)."""
    root = tmp_path_factory.getbasetemp() / "mhalab_tiny_ckpt"
    done = root / "best.txt"
    if done.is_file():
        return done.read_text()
    root.mkdir(exist_ok=True)
    args = [sys.executable, "-m", "mhalab.train"] + TINY + [
        "attention.n_heads=4", "model.n_layers=2", "stats.plots=false", f"data.cache_dir={root / 'cache'}"]
    env = {**os.environ, "MHALAB_ROOT": str(root), "WANDB_SILENT": "true"}
    env.pop("MHALAB_RUN_ID", None)
    p = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    summary = json.loads(next(root.rglob("summary.json")).read_text())
    done.write_text(summary["checkpoints"]["best"])
    return summary["checkpoints"]["best"]


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory)


@pytest.fixture(scope="module")
def loaded(tiny_ckpt):
    module = load_module(tiny_ckpt)
    batches = eval_batches(build_data(load_run_config(tiny_ckpt)), "validation", 2)
    return module, batches


def test_zero_ablation_equals_gate_zero_and_full_row_equals_plain_eval(loaded):
    module, batches = loaded
    base, rows = single_head_ablation(module, batches)
    assert base == evaluate(module, batches)
    assert len(rows) == 2 * 4 and rows[5]["head"] == "L1H1"
    layer = module.attention_layers()[1]
    layer.head_gate[1] = 0.0
    try:
        gated = evaluate(module, batches)
    finally:
        layer.head_gate[1] = 1.0
    assert rows[5]["zero_loss"] == pytest.approx(gated["loss"], abs=1e-6)
    assert rows[5]["zero_dloss"] == pytest.approx(gated["loss"] - base["loss"], abs=1e-6)
    assert all(g.eq(1).all() for g in (l.head_gate for l in module.attention_layers()))  # gates restored
    # mean ablation is a different intervention from zero ablation
    assert any(abs(r["mean_loss"] - r["zero_loss"]) > 1e-6 for r in rows)


def test_mean_ablation_replaces_the_head_slice_with_its_mean(loaded):
    module, batches = loaded
    abl = MeanAblation(module).fit(batches)
    layer = module.attention_layers()[0]
    seen = {}
    with abl.active([(0, 2)]):
        handle = layer.out_proj.register_forward_pre_hook(lambda m, a: seen.__setitem__("x", a[0].detach().clone()))
        try:
            module(batches[0])
        finally:
            handle.remove()
    d = layer.d_head
    # the recording hook was registered after the ablation hook, so it sees the replaced input
    assert torch.allclose(seen["x"][..., 2 * d:3 * d], abl.means[0][2 * d:3 * d].expand_as(seen["x"][..., 2 * d:3 * d]))
    assert not torch.allclose(seen["x"][..., :d], abl.means[0][:d].expand_as(seen["x"][..., :d]))


def test_pruning_curve_starts_unpruned_and_ends_with_every_head(loaded):
    module, batches = loaded
    curve = pruning_curve(module, batches, step=0.25)
    base = evaluate(module, batches)
    assert curve[0]["n_pruned"] == 0 and curve[0]["fraction"] == 0.0 and curve[0]["acc"] == base["acc"]
    assert [r["n_pruned"] for r in curve] == [0, 2, 4, 6, 8]
    assert curve[-1]["fraction"] == 1.0
    pruned = " ".join(r["pruned_now"] for r in curve).split()
    assert sorted(pruned) == sorted(f"L{l}H{h}" for l in range(2) for h in range(4))  # each head pruned once
    assert all(g.eq(1).all() for g in (l.head_gate for l in module.attention_layers()))


def test_cli_writes_tables_and_plots(tiny_ckpt, tmp_path, capsys):
    main([tiny_ckpt, f"out={tmp_path / 'abl'}", "batches=2"])
    out = tmp_path / "abl"
    for f in ("heads.md", "heads.csv", "pruning.md", "pruning.csv", "ablation.json", "ablation_heatmap.png",
              "pruning_curve.png"):
        assert (out / f).exists(), f
    with (out / "heads.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["head"] == "none" and len(rows) == 1 + 8
    assert sorted(int(r["rank"]) for r in rows[1:]) == list(range(1, 9))
    with (out / "pruning.csv").open() as f:
        curve = list(csv.DictReader(f))
    assert int(curve[0]["n_pruned"]) == 0 and int(curve[-1]["n_pruned"]) == 8 and len(curve) == 9  # 10%: 1 of 8


def test_bad_checkpoint_is_a_one_sentence_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "missing.ckpt")])
    assert e.value.code == 2 and capsys.readouterr().err.startswith("error: checkpoint")
