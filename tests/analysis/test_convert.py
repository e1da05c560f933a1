"""mhalab.analysis.convert: MHA -> GQA mean-pooling (Ainslie et al. 2023), first/random inits, identity, errors, CLI."""

import dataclasses
import json

import pytest
import torch
from conftest import arch

from mhalab.analysis.convert import convert_module
from mhalab.cli import main
from mhalab.errors import ConfigError
from mhalab.training.module import AttentionLitModule
from mhalab.config.schema import OptimConfig

OPTIM = dataclasses.asdict(OptimConfig(lr=1e-3, weight_decay=0.0, warmup_steps=0))


def mha(n_heads=4, d_model=16, n_kv_heads=None, objective="classification"):
    torch.manual_seed(0)
    a = arch(20, objective, 3 if objective == "classification" else None, max_len=12, d_model=d_model, n_layers=2,
             n_heads=n_heads, n_kv_heads=n_kv_heads, d_ff=32, dropout=0.0)
    m = AttentionLitModule(a.to_dict(), OPTIM, [1] * 20 if objective != "classification" else None)
    for p in m.parameters():  # distinct values everywhere, biases included
        torch.nn.init.normal_(p, std=0.3)
    return m.eval()


def batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(4, 20, (3, 10), generator=g)
    pad = torch.zeros(3, 10, dtype=torch.bool)
    pad[0, 7:] = True
    return {"input_ids": ids, "padding_mask": pad, "labels": torch.tensor([0, 1, 2])}


def test_mean_pool_gives_group_means_of_k_and_v_rows():
    src = mha(n_heads=4)
    new = convert_module(src, 2, "mean")
    d = src.arch.attention.d_head
    for a, b in zip(src.attention_layers(), new.attention_layers()):
        assert b.n_kv_heads == 2 and b.k_proj.weight.shape == (2 * d, 16)
        for proj in ("k_proj", "v_proj"):
            w_src, w_new = getattr(a, proj).weight, getattr(b, proj).weight
            b_src, b_new = getattr(a, proj).bias, getattr(b, proj).bias
            for g in range(2):
                heads = [w_src[h * d:(h + 1) * d] for h in (2 * g, 2 * g + 1)]
                assert torch.allclose(w_new[g * d:(g + 1) * d], (heads[0] + heads[1]) / 2)
                assert torch.allclose(b_new[g * d:(g + 1) * d], (b_src[2 * g * d:(2 * g + 1) * d] +
                                                                b_src[(2 * g + 1) * d:(2 * g + 2) * d]) / 2)
        for proj in ("q_proj", "out_proj"):  # everything else copied
            assert torch.equal(getattr(a, proj).weight, getattr(b, proj).weight)
    assert torch.equal(src.model.classifier.weight, new.model.classifier.weight)


def test_first_copies_the_first_head_and_random_is_fresh():
    src = mha(n_heads=4)
    first = convert_module(src, 1, "first")
    rand = convert_module(src, 1, "random", seed=3)
    d = src.arch.attention.d_head
    a, b, r = src.attention_layers()[0], first.attention_layers()[0], rand.attention_layers()[0]
    assert torch.equal(b.k_proj.weight, a.k_proj.weight[:d]) and torch.equal(b.v_proj.bias, a.v_proj.bias[:d])
    assert r.k_proj.weight.std().item() == pytest.approx(0.02, rel=0.5) and r.k_proj.bias.abs().sum() == 0
    assert torch.equal(r.q_proj.weight, a.q_proj.weight)


@pytest.mark.parametrize("init", ["mean", "first"])
def test_same_number_of_kv_heads_is_the_identity(init):
    src = mha(n_heads=4)
    new = convert_module(src, 4, init)
    with torch.no_grad():
        assert torch.equal(src(batch()).logits, new(batch()).logits)


def test_gqa_source_pools_further_and_reads_the_same_heads():
    src = mha(n_heads=4, n_kv_heads=2)
    new = convert_module(src, 1, "mean")
    a, b = src.attention_layers()[0], new.attention_layers()[0]
    d = src.arch.attention.d_head
    assert torch.allclose(b.k_proj.weight, (a.k_proj.weight[:d] + a.k_proj.weight[d:]) / 2)


@pytest.mark.parametrize("g, msg", [(3, "must divide n_heads"), (0, "--n-kv-heads=0: --n-kv-heads must be an integer >= 1")])
def test_wrong_architecture_is_a_config_error(g, msg):
    with pytest.raises(ConfigError, match=msg):
        convert_module(mha(n_heads=4), g)
    with pytest.raises(ConfigError, match="must divide the source"):
        convert_module(mha(n_heads=4, n_kv_heads=2), 4)
    with pytest.raises(ConfigError, match="init must be one of"):
        convert_module(mha(n_heads=4), 2, "median")


def test_cli_compares_with_an_mha_control_of_equal_total_steps_over_seeds(tiny_runs, tmp_path, capsys):
    ckpts = [str(run / "checkpoints" / "last.ckpt") for run in tiny_runs]  # 2 seeds, 2 layers x 4 heads, 3 steps
    out = tmp_path / "conv"
    main(["convert", *ckpts, "n_kv_heads=2", "uptrain_fraction=0.5", "batches=2", f"out={out}", "init=mean,first",
          "margin=0.5"])
    res = json.loads((out / "conversion.json").read_text())
    rows = res["rows"]
    assert {r["seed"] for r in rows} == {0, 1} and all(r["uptrain_steps"] == 2 for r in rows)
    arms = {(r["arm"], r["init"], r["stage"]): r["total_steps"] for r in rows if r["seed"] == 0}
    assert arms[("source (MHA)", "-", "trained")] == 3
    assert arms[("source (MHA) + extra steps", "-", "same total steps")] == 5  # the control: 3 + 2
    assert arms[("converted GQA-2", "mean", "after uptraining")] == 5
    assert arms[("GQA-2 from scratch", "random", "uptraining steps only")] == 2
    assert arms[("GQA-2 from scratch", "random", "same total steps")] == 5  # as many steps as the converted model
    assert all(r["n"] == 2 and r["ci95_low"] <= r["bpb"] <= r["ci95_high"] for r in res["table"])
    comparisons = {c["comparison"]: c for c in res["comparisons"] if "negative control" not in c["comparison"]}
    negative = [c for c in res["comparisons"] if "negative control" in c["comparison"]]  # with --margin: the inits
    assert [c["comparison"] for c in negative] == ["first init - source (before uptraining; negative control)"]
    assert set(comparisons) == {"mean-pool - first (before uptraining)", "mean-pool - first (after uptraining)",
                                "mean-pool - MHA control (same total steps)",
                                "mean-pool - GQA from scratch (same total steps)"}
    # 2 sources: the exact sign-flip test cannot go below p = 0.5, so nothing is separated
    assert all(c["n"] == 2 and c["test"] == "exact sign-flip test (paired)" and c["p_min"] == 0.5 and
               c["verdict"] != "separated" for c in comparisons.values())
    control = comparisons["mean-pool - MHA control (same total steps)"]
    assert control["tost_margin"] == 0.5 and control["tost_p"] >= 0.25  # 2 pairs: one-sided p >= 1/4
    assert control["equivalence"].startswith("not shown equivalent")
    assert res["margin"] == 0.5 and rows[0]["eval_examples"] > 0
    assert (out / "conversion.md").exists() and (out / "conversion.png").exists()
    with pytest.raises(SystemExit) as e:
        main(["convert", ckpts[0], "n_kv_heads=3"])
    assert e.value.code == 2 and "must divide" in capsys.readouterr().err
