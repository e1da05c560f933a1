"""mhalab.analysis.ablate: single-head zero/mean ablation, importance ranking and the iterative pruning curve."""

import csv
import json

import pytest
import torch

from mhalab.analysis.ablate import MeanAblation, layer_summary, pruning_curve, random_orders, single_head_ablation
from mhalab.cli import main
from mhalab.training.checkpoint import build_data, load_module, load_run
from mhalab.training.evaluation import evaluate, split_batches
from mhalab.hooks import run_with_cache


@pytest.fixture(scope="module")
def ckpts(tiny_runs):
    return [run / "checkpoints" / "last.ckpt" for run in tiny_runs]


@pytest.fixture(scope="module")
def loaded(ckpts):
    module = load_module(ckpts[0])
    batches = split_batches(build_data(load_run(ckpts[0])[1]), "validation", 2)
    return module, batches


def test_zero_ablation_equals_a_zero_out_proj_slice_and_full_row_equals_plain_eval(loaded):
    module, batches = loaded
    base, rows = single_head_ablation(module, batches)
    assert base == evaluate(module, batches)
    assert len(rows) == 2 * 4 and rows[5]["head"] == "L1H1"
    layer = module.attention_layers()[1]
    saved = layer.out_proj.weight.detach().clone()
    with torch.no_grad():
        layer.out_proj.weight[:, layer.d_head:2 * layer.d_head] = 0  # L1H1 writes nothing
    try:
        gated = evaluate(module, batches)
    finally:
        with torch.no_grad():
            layer.out_proj.weight.copy_(saved)
    assert rows[5]["zero_loss"] == pytest.approx(gated["loss"], abs=1e-6)
    assert rows[5]["zero_dloss"] == pytest.approx(gated["loss"] - base["loss"], abs=1e-6)
    assert not any(l.hook_fns for l in module.attention_layers())  # hooks detached
    # mean ablation is a different intervention from zero ablation
    assert any(abs(r["mean_loss"] - r["zero_loss"]) > 1e-6 for r in rows)


def test_mean_ablation_replaces_the_head_slice_with_its_mean(loaded):
    module, batches = loaded
    abl = MeanAblation(module).fit(batches)
    with abl.active([(0, 2)]):
        _, cache = run_with_cache(module, batches[0], names_filter="blocks.0.attn.hook_z")
    z = cache["z", 0]  # (B, T, H, D)
    # the cache hooks run after the ablation hook, so they see the replaced output
    assert torch.allclose(z[:, :, 2], abl.means[0][2].expand_as(z[:, :, 2]))
    assert not torch.allclose(z[:, :, 0], abl.means[0][0].expand_as(z[:, :, 0]))


def test_pruning_curve_starts_unpruned_and_ends_with_every_head(loaded):
    module, batches = loaded
    curve = pruning_curve(module, batches, step=0.25)
    base = evaluate(module, batches)
    assert curve[0]["n_pruned"] == 0 and curve[0]["fraction"] == 0.0 and curve[0]["acc"] == base["acc"]
    assert [r["n_pruned"] for r in curve] == [0, 2, 4, 6, 8]
    assert curve[-1]["fraction"] == 1.0
    pruned = " ".join(r["pruned_now"] for r in curve).split()
    assert sorted(pruned) == sorted(f"L{l}H{h}" for l in range(2) for h in range(4))  # each head pruned once
    assert not any(l.hook_fns for l in module.attention_layers())


def test_random_orders_are_seeded_permutations_of_the_heads(loaded):
    module, batches = loaded
    a, b = random_orders(module, 3, seed=0), random_orders(module, 3, seed=0)
    assert a == b and len({tuple(o) for o in a}) == 3
    assert all(sorted(o) == [(l, h) for l in range(2) for h in range(4)] for o in a)
    curve = pruning_curve(module, batches, step=0.25, order=a[0])
    assert curve[1]["pruned_now"] == " ".join(f"L{l}H{h}" for l, h in a[0][:2])


@pytest.mark.slow
def test_cli_scores_on_validation_evaluates_on_test_against_random_orders_over_seeds(ckpts, tmp_path, capsys):
    main(["ablate", *map(str, ckpts), f"out={tmp_path / 'abl'}", "batches=2", "random_orders=3", "step=0.25"])
    out = tmp_path / "abl"
    for f in ("heads.md", "heads.csv", "pruning.md", "pruning.csv", "ablation.json", "ablation_heatmap.png",
              "pruning_curve.png"):
        assert (out / f).exists(), f
    with (out / "heads.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 8 and sorted(int(r["rank"]) for r in rows[:8]) == list(range(1, 9))
    assert len({(r["checkpoint"], r["seed"]) for r in rows}) == 2  # each row says which checkpoint (seed) it is
    result = json.loads((out / "ablation.json").read_text())
    assert result["importance_split"] == "validation" and result["eval_split"] == "test" and result["key"] == "bpb"
    curve = result["pruning"]
    assert [r["n_pruned"] for r in curve] == [0, 2, 4, 6, 8]
    first = curve[1]
    assert first["random_p10"] <= first["random_bpb"] <= first["random_p90"]
    assert first["importance_ci95_low"] <= first["importance_bpb"] <= first["importance_ci95_high"]
    assert first["vs_random_n"] == 2 and first["vs_ablation_n"] == 2
    assert first["vs_random_test"] == "exact sign-flip test (paired)"
    # 2 checkpoints: the smallest p is 2/4 = 0.5, so nothing can be separated, and the verdict says so
    assert first["vs_random_p_min"] == 0.5 and first["vs_random_verdict"] in ("not separated",) or \
        "no spread" in first["vs_random_verdict"]
    assert first["ablation_bpb"] is not None and "vs_random_p" not in curve[0]  # nothing pruned: nothing tested
    assert curve[-1]["vs_random_mean"] == pytest.approx(0, abs=1e-9)  # every head pruned: the same model
    holm_ps = [r[f"{side}_p_holm"] for r in curve for side in ("vs_random", "vs_ablation")
               if r.get(f"{side}_p_holm") is not None]
    assert holm_ps and all(p >= 0.5 for p in holm_ps)
    text = (out / "pruning.md").read_text()
    assert "random orders" in text and "single-head ablation order" in text and "Holm" in text


def test_bad_checkpoint_and_flags_are_one_sentence_errors(ckpts, tmp_path, capsys):
    for argv, message in (([str(tmp_path / "missing.ckpt")], "error: checkpoint"),
                          ([str(ckpts[0]), "--step", "0"], "error: --step=0.0"),
                          ([str(ckpts[0]), "--random-orders", "-1"], "error: --random-orders=-1"),
                          ([str(ckpts[0]), "--threads", "0"], "error: --threads=0")):
        with pytest.raises(SystemExit) as e:
            main(["ablate", *argv])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith(message) and "Traceback" not in err, (argv, err)


def test_layer_summary_averages_each_checkpoints_layer_mean_and_worst_head():
    def result(deltas):  # one checkpoint, layer 0 heads with these zero-ablation accuracy changes
        return {"heads": [{"layer": 0, "zero_dacc": d} for d in deltas]}
    (row,) = layer_summary([result([0.0, -0.2]), result([-0.1, -0.3])], "acc")
    assert row["n"] == 2 and row["mean_d"] == pytest.approx(-0.15) and row["worst_d"] == pytest.approx(-0.25)
    assert row["worst_d_ci95_low"] < -0.25 < row["worst_d_ci95_high"]
    (row,) = layer_summary([{"heads": [{"layer": 0, "zero_dbpb": d} for d in (0.1, 0.3)]}], "bpb")
    assert row["worst_d"] == pytest.approx(0.3) and row["worst_d_ci95_low"] is None  # lower is better: the rise


@pytest.mark.slow
def test_ablate_publishes_comparisons_and_sources_that_report_numerics_reads(ckpts, tmp_path, capsys):
    """ablation.json carries the pruning table's tests in report form, runs.csv each source's environment, so that
    `mhalab report --numerics` puts two ablations of one design side by side (pruning's second numerics)."""
    outs = []
    for name in ("B", "avx2"):
        out = tmp_path / name
        main(["ablate", *map(str, ckpts), f"out={out}", "batches=2", "random_orders=2", "step=0.25"])
        outs.append(f"{name}:{out / 'ablation.json'}")
    result = json.loads((tmp_path / "B" / "ablation.json").read_text())
    tested = [r for r in result["pruning"] if r["n_pruned"] > 0]
    assert len(result["comparisons"]) == 2 * len(tested)
    c = result["comparisons"][0]
    assert c["arm"] == "importance order" and c["baseline"] == "random orders (mean)"
    assert c["endpoint"] == "test bpb with 2 of 8 heads pruned" and c["estimate"] == tested[0]["vs_random_mean"]
    with (tmp_path / "B" / "runs.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and {r["in_verdicts"] for r in rows} == {"True"} and rows[0]["env_cpu_capability"]
    main(["report", "--numerics", *outs, "--out", str(tmp_path / "stab")])
    stab = json.loads((tmp_path / "stab" / "stability.json").read_text())
    assert len(stab["rows"]) == len(result["comparisons"])
    assert {r["baseline"] for r in stab["rows"]} == {"random orders (mean)", "single-head ablation order"}
    assert all(r["stable"] in (True, None) for r in stab["rows"])  # the same checkpoints: the same verdicts
