"""mhalab.hooks: named hook points in every attention layer, run_with_cache / run_with_hooks, and every per-head
result (statistics, importance, zero and mean ablation, pruning) identical to the code before hook points."""

from pathlib import Path

import pytest
import torch

from conftest import arch

from mhalab.analysis.ablate import MeanAblation, pruning_curve, single_head_ablation
from mhalab.attention import MultiHeadAttention
from mhalab.training.callbacks import HeadStatsCallback
from mhalab.training.evaluation import importance
from mhalab.hooks import POINTS, act_name, hook_names, hooks, run_with_cache, run_with_hooks
from mhalab.model import build_model
from mhalab.training.module import AttentionLitModule

# written by tests/heads/make_hooks_reference.py with the code of a08120a, before the hook points
REFERENCE = Path(__file__).parent / "hooks_reference.pt"


def model(**sizes):
    base = dict(max_len=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, dropout=0.0)
    return build_model(arch(40, "clm", None, **{**base, **sizes})).eval()


def test_names_follow_transformer_lens():
    names = hook_names(model())
    assert names[:2] == ["blocks.0.attn.hook_q", "blocks.0.attn.hook_k"] and len(names) == 2 * len(POINTS)
    assert act_name("pattern", 1) == "blocks.1.attn.hook_pattern" == act_name("hook_pattern", 1)
    assert hook_names(MultiHeadAttention(16, 4))[0] == "hook_q"
    with pytest.raises(ValueError, match="unknown hook point"):
        act_name("attn", 0)


def test_cache_shapes_and_indexing():
    m = model(pos="rotary")
    ids = torch.randint(0, 40, (3, 10))
    out, cache = run_with_cache(m, ids)
    B, T, H, G, D = 3, 10, 4, 2, 8
    assert cache["q", 0].shape == (B, T, H, D) and cache["k", 1].shape == (B, T, G, D)
    assert cache["v", 0].shape == (B, T, G, D) and cache["z", 1].shape == (B, T, H, D)
    assert cache["pattern", 0].shape == (B, H, T, T) == cache["attn_scores", 0].shape
    assert cache["pattern", 0] is cache["blocks.0.attn.hook_pattern"]
    assert torch.allclose(cache["pattern", 1].sum(-1), torch.ones(B, H, T))
    assert torch.all(cache["pattern", 0].triu(1) == 0)  # causal
    assert "blocks.0.attn.hook_result" not in cache  # off unless asked, as in TransformerLens
    assert cache.stack("pattern").shape == (2, B, H, T, T)
    assert torch.allclose(out.logits, m(ids).logits, atol=1e-6)
    _, only = run_with_cache(m, ids, names_filter=["blocks.1.attn.hook_z"])
    assert list(only) == ["blocks.1.attn.hook_z"] and torch.allclose(only["z", 1], cache["z", 1], atol=1e-6)  # sdpa


def test_result_sums_to_the_layer_output():
    attn = MultiHeadAttention(16, 4, 2, d_head=6)
    x = torch.randn(2, 5, 16)
    out, cache = run_with_cache(attn, x, names_filter=["hook_result", "hook_z"])
    assert cache["hook_result"].shape == (2, 5, 4, 16)
    assert torch.allclose(cache["hook_result"].sum(2) + attn.out_proj.bias, attn(x)[0], atol=1e-6)
    w = attn.out_proj.weight.view(16, 4, 6)[:, 1]  # head 1's columns of out_proj
    assert torch.allclose(cache["hook_result"][:, :, 1], cache["hook_z"][:, :, 1] @ w.T, atol=1e-6)


def test_a_hook_replaces_what_it_returns_and_is_detached_after_an_error():
    m = model()
    ids = torch.randint(0, 40, (2, 8))
    base = m(ids).logits
    uniform = lambda p, hook: torch.where(p > 0, 1.0, 0.0) / (p > 0).sum(-1, keepdim=True)  # noqa: E731
    changed = run_with_hooks(m, ids, fwd_hooks=[(lambda n: n.endswith("hook_pattern"), uniform)]).logits
    assert not torch.allclose(changed, base)
    seen = []
    with pytest.raises(RuntimeError, match="boom"):
        with hooks(m, [("blocks.0.attn.hook_v", lambda v, hook: seen.append(hook.name))]):
            m(ids)
            raise RuntimeError("boom")
    assert seen == ["blocks.0.attn.hook_v"]
    assert not any(layer.hook_fns for layer in m.attention_layers())
    assert torch.equal(m(ids).logits, base)
    with pytest.raises(ValueError, match="returned shape"):
        run_with_hooks(m, ids, fwd_hooks=[("blocks.0.attn.hook_z", lambda z, hook: z[:, :1])])
    assert not any(layer.hook_fns for layer in m.attention_layers())


def test_nothing_attached_keeps_the_fused_kernel(monkeypatch):
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    m = model()
    ids = torch.randint(0, 40, (2, 8))
    m(ids)
    assert len(calls) == 2
    run_with_cache(m, ids, names_filter=lambda n: n.endswith(("hook_z", "hook_q")))  # no pattern needed
    assert len(calls) == 4
    run_with_cache(m, ids, names_filter=lambda n: n.endswith("hook_pattern"))  # the pattern: explicit softmax
    assert len(calls) == 4


def test_hooks_see_the_new_positions_with_a_kv_cache():
    m = model(pos="rotary")
    ids = torch.randint(0, 40, (1, 6))
    caches = m.encoder.new_caches(1)
    m(ids[:, :5], caches=caches)
    _, cache = run_with_cache(m, ids[:, 5:], caches=caches)
    assert cache["k", 0].shape == (1, 1, 2, 8) and cache["pattern", 0].shape == (1, 4, 1, 6)
    _, full = run_with_cache(m, ids)
    assert torch.allclose(cache["pattern", 1][0, :, 0], full["pattern", 1][0, :, 5], atol=1e-6)


@pytest.mark.parametrize("name", ["cls", "clm"])
def test_every_statistic_and_importance_is_what_the_code_before_hooks_gave(name):
    """A tiny trained model's statistics, importance, zero and mean ablation and pruning curve against values
    computed with the code before hook points (need_weights, head_gate, out_proj pre-hooks). On the machine that
    wrote them they are bit-identical; the tolerance leaves room for another CPU's kernels."""
    ref = torch.load(REFERENCE, weights_only=True)[name]
    optim = {"lr": 1e-3, "weight_decay": 0.0, "betas": [0.9, 0.999], "eps": 1e-8, "warmup_steps": 0,
             "min_lr_ratio": 1.0}
    m = AttentionLitModule(ref["arch"], optim, [1] * 40 if ref["objective"] != "classification" else None)
    state = dict(ref["state_dict"])  # the old code's state dict: a head_gate buffer of ones per layer, no effect
    gates = [state.pop(k) for k in list(state) if k.endswith("head_gate")]
    assert gates and all(bool((g == 1).all()) for g in gates)
    m.load_state_dict(state)
    m.eval()
    close = dict(rtol=1e-5, atol=1e-7)
    cb = HeadStatsCallback()
    cb.probe = ref["probe"]
    stats, groups, _ = cb.measure(m)
    for key, value in ref["stats"].items():
        torch.testing.assert_close(stats[key], value, **close)
    for key, value in ref["groups"].items():
        torch.testing.assert_close(groups[key], value, equal_nan=True, **close)
    torch.testing.assert_close(importance(m, ref["batches"], normalize=False), ref["importance_raw"], **close)
    torch.testing.assert_close(importance(m, ref["batches"]), ref["importance"], **close)
    base, rows = single_head_ablation(m, ref["batches"])
    assert base == pytest.approx(ref["base"], rel=1e-6)
    for row, old in zip(rows, ref["rows"], strict=True):
        assert same(row, old)
    for mean, old in zip(MeanAblation(m).fit(ref["batches"]).means, ref["means"], strict=True):
        torch.testing.assert_close(mean.flatten(), old, **close)
    curve = pruning_curve(m, ref["batches"], step=0.25)
    assert [r["pruned_now"] for r in curve] == [r["pruned_now"] for r in ref["curve"]]
    for row, old in zip(curve, ref["curve"], strict=True):
        assert same(row, old)


def same(row: dict, old: dict) -> bool:
    """Equal keys, equal text, numbers within 1e-6 relative; a difference of two float32 losses of order 1
    (`*_dloss`, `*_dbpb`) within 2e-6 absolute, the rounding another CPU's kernels leave in each loss (AVX-512
    against the AVX2 machine that wrote the reference: up to 6e-7)."""
    def tol(k):
        return dict(rel=1e-6, abs=2e-6 if k.endswith(("dloss", "dbpb")) else 1e-9)

    return row.keys() == old.keys() and all(
        row[k] == old[k] if isinstance(old[k], str) else row[k] == pytest.approx(old[k], **tol(k)) for k in old)


# ---------------------------------------------------------------- the examples of docs/heads.md

README = Path(__file__).resolve().parents[2] / "docs" / "heads.md"  # moved from README.md


def readme_code(marker: str) -> str:
    """The first ```python block after `<!-- marker -->` in docs/heads.md."""
    text = README.read_text()
    after = text[text.index(f"<!-- {marker} -->"):]
    return after[after.index("```python\n") + len("```python\n"):after.index("\n```", after.index("```python"))]


def test_package_root_exports_the_public_names():
    import mhalab

    for name in mhalab.__all__:
        assert getattr(mhalab, name) is not None, name
    from mhalab import MultiHeadAttention as M, open_run, patch_heads, run_with_cache  # noqa: F401

    assert M is MultiHeadAttention


def test_the_readme_user_statistic(train, tmp_path):
    import sys

    from mhalab.runs.summary import read_summary

    (tmp_path / "mystats.py").write_text(readme_code("user-statistic"))
    sys.path.insert(0, str(tmp_path))
    try:
        refused = train("+stats.extra.local={_target_:mystats.LocalMass,window:2}")
        assert refused.returncode == 2 and "--allow mystats" in refused.stderr
        r = train("+stats.extra.local={_target_:mystats.LocalMass,window:2}", "stats.plots=true",
                  flags=("--allow", "mystats"))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("mystats", None)
    assert r.returncode == 0, r.stderr[-3000:]
    (run_dir,) = (tmp_path / "logs" / "train" / "runs").iterdir()
    s = read_summary(run_dir)
    local = torch.tensor(s.head_stats["local"])  # (n_layers, n_heads)
    assert local.shape == (1, 2) and ((local > 0) & (local <= 1)).all()
    assert (run_dir / "plots" / "stat_local.png").exists() and (run_dir / "plots" / "stat_induction_score.png").exists()
    header = (run_dir / "csv" / "metrics.csv").read_text().splitlines()[0]
    assert "attn/L0H1/local" in header and "attn/L0H0/induction_score" in header


def test_the_readme_hooks_and_patching_examples_on_an_mqar_run(train, tmp_path, capfd):
    r = train("data=mqar", "data.mqar.n_train=200", "data.mqar.n_val=32", "data.mqar.n_test=32",
              "data.mqar.seq_len=32", "data.mqar.n_kv_pairs=4", "model.n_layers=2", "attention.n_heads=4")
    assert r.returncode == 0, r.stderr[-3000:]
    (run_dir,) = (tmp_path / "logs" / "train" / "runs").iterdir()
    scope: dict = {}
    exec(readme_code("hooks").replace("logs/train/runs/<id>", str(run_dir)), scope)
    assert scope["cache"]["pattern", 0].shape[1] == 4 and scope["without"].logits.shape == scope["out"].logits.shape
    scope = {}
    exec(readme_code("patching").replace("logs/train/runs/<id>", str(run_dir)), scope)
    out = capfd.readouterr().out
    assert "accuracy clean" in out
    result = scope["r"]
    assert result["patched"].shape == (2, 4) and result["recovered"].shape == (2, 4)
    clean, corrupted = scope["clean"], scope["corrupted"]
    assert torch.equal(clean["input_ids"][:, 0:8:2], corrupted["input_ids"][:, 0:8:2])  # keys kept
    assert torch.equal(corrupted["input_ids"][1, 1:8:2], clean["input_ids"][0, 1:8:2])  # values of the next example
    assert torch.equal(clean["input_ids"][:, 8:], corrupted["input_ids"][:, 8:])  # queries kept
    same = scope["patch_heads"](scope["run"].module, clean, clean)  # nothing to restore: all give the clean metric
    assert (same["patched"] == same["clean"]).all() and same["recovered"].isnan().all()
    assert not any(layer.hook_fns for layer in scope["run"].module.attention_layers())


def test_per_head_weight_views_compute_what_the_hook_points_hold():
    attn = MultiHeadAttention(16, 4, 2, d_head=6)
    x = torch.randn(2, 5, 16)
    _, cache = run_with_cache(attn, x, names_filter=["hook_q", "hook_k", "hook_v", "hook_z", "hook_result"])
    assert attn.W_Q.shape == (4, 16, 6) and attn.W_K.shape == (2, 16, 6) and attn.W_O.shape == (4, 6, 16)
    for point, w, proj in (("hook_q", attn.W_Q, "q"), ("hook_k", attn.W_K, "k"), ("hook_v", attn.W_V, "v")):
        expected = torch.einsum("btm,hmd->bthd", x, w) + attn.head_bias(proj)  # (B, T, heads, D)
        assert torch.allclose(cache[point], expected, atol=1e-6), point
    assert torch.allclose(cache["hook_result"], torch.einsum("bthd,hdm->bthm", cache["hook_z"], attn.W_O), atol=1e-6)
    with torch.no_grad():
        attn.W_K[1].zero_()  # the views write through to the Linear
    assert attn.k_proj.weight[6:].abs().sum() == 0 and attn.k_proj.weight[:6].abs().sum() > 0
