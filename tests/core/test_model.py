"""The encoder and its heads: shapes, positions, norms, attention weights on request, KV-cache decoding."""

import pytest
import torch

from conftest import arch

from mhalab.errors import ConfigError
from mhalab.hooks import run_with_cache
from mhalab.model import LanguageModel, SequenceClassifier, build_model
from mhalab.architecture import Architecture

torch.manual_seed(0)


def tiny(objective: str = "classification", n_classes: int | None = None, **kw) -> Architecture:
    base = dict(max_len=32, d_model=32, n_layers=2, n_heads=4, d_ff=64, dropout=0.0)
    base.update(kw)
    return arch(50, objective, n_classes, **base)


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rotary"])
@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_classifier_shapes_and_attentions(pos, norm, pooling):
    model = SequenceClassifier(tiny(n_classes=5, pos=pos, norm=norm, n_kv_heads=2, d_head=6, pooling=pooling))
    ids = torch.randint(0, 50, (3, 10))
    pad = torch.arange(10).view(1, 10) >= torch.tensor([10, 7, 4]).view(3, 1)
    out, cache = run_with_cache(model, ids, pad, names_filter=lambda n: n.endswith("hook_pattern"))
    assert out.logits.shape == (3, 5)
    assert len(cache) == 2 and cache["pattern", 0].shape == (3, 4, 10, 10)
    assert torch.all(cache["pattern", 1][2, :, :, 4:] == 0)
    assert torch.allclose(model(ids, pad).logits, out.logits, atol=1e-6)  # sdpa, and the math path of the cache
    # padded tokens do not change the prediction
    ids2 = ids.clone()
    ids2[2, 4:] = (ids2[2, 4:] + 1) % 50
    assert torch.allclose(model(ids2, pad).logits, out.logits, atol=1e-5)


def test_mean_pooling_ignores_padding_and_cls_uses_first_token():
    ids = torch.randint(5, 50, (2, 6))
    pad = torch.arange(6).view(1, 6) >= torch.tensor([6, 3]).view(2, 1)
    mean = SequenceClassifier(tiny(pooling="mean")).eval()
    h = mean.encoder(ids, pad).hidden  # (B, T, d_model)
    expected = torch.stack([h[0].mean(0), h[1, :3].mean(0)])
    assert torch.allclose(mean(ids, pad).logits, mean.classifier(expected), atol=1e-6)
    cls = SequenceClassifier(tiny(pooling="cls")).eval()
    assert torch.allclose(cls(ids, pad).logits, cls.classifier(cls.encoder(ids, pad).hidden[:, 0]), atol=1e-6)
    with pytest.raises(ConfigError, match="model.pooling"):
        tiny(pooling="max")


def test_backends_give_the_same_model_output():
    model = build_model(tiny("mlm", n_kv_heads=1, pos="rotary")).eval()
    ids = torch.randint(0, 50, (2, 12))
    a = model(ids).logits
    for layer in model.attention_layers():
        layer.backend = "math"
    assert torch.allclose(a, model(ids).logits, atol=1e-5)


def test_lm_head_is_tied_to_the_embedding():
    model = LanguageModel(tiny("mlm"))
    assert model.lm_head.weight is model.encoder.tok_emb.weight
    assert model(torch.randint(0, 50, (2, 7))).logits.shape == (2, 7, 50)
    untied = LanguageModel(tiny("mlm", tie_weights=False))
    assert untied.lm_head.weight is not untied.encoder.tok_emb.weight


def test_sequence_longer_than_positional_table_is_refused():
    model = build_model(tiny(max_len=8))
    with pytest.raises(ValueError, match="max_len"):
        model(torch.randint(0, 50, (1, 9)))


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rotary"])
def test_kv_cache_decoding_gives_full_forward_logits(pos):
    model = LanguageModel(tiny("clm", pos=pos, n_kv_heads=2)).eval()
    ids = torch.randint(0, 50, (2, 9))
    full = model(ids).logits
    caches = model.encoder.new_caches(2)
    logits = [model(ids[:, :4], caches=caches).logits]
    logits += [model(ids[:, t:t + 1], caches=caches).logits for t in range(4, 9)]
    assert torch.allclose(torch.cat(logits, 1), full, atol=1e-5)
    assert caches[0].length == 9


def test_causal_model_does_not_see_the_future():
    model = LanguageModel(tiny("clm")).eval()
    ids = torch.randint(0, 50, (1, 8))
    ids2 = ids.clone()
    ids2[0, 5:] = (ids2[0, 5:] + 1) % 50
    assert torch.allclose(model(ids).logits[:, :5], model(ids2).logits[:, :5], atol=1e-5)


@pytest.mark.parametrize("kw,key", [
    (dict(n_heads=8, n_kv_heads=3), "attention.n_kv_heads=3 with attention.n_heads=8"),
    (dict(norm="sandwich"), "model.norm"),
    (dict(pos="alibi"), "model.pos"),
    (dict(n_layers=0), "model.n_layers"),
    (dict(pos="rotary", d_head=5), "d_head"),
    (dict(backend="xformers"), "attention.backend"),
    (dict(pos="rotary", rotary_dim=6, d_head=4), "model.rotary_dim"),
    (dict(rope_base=1.0), "model.rope_base"),
])
def test_config_errors_name_the_key(kw, key):
    with pytest.raises(ConfigError, match=key):
        tiny(**kw)


def test_unknown_architecture_keys_are_refused():
    good = tiny().to_dict()
    assert Architecture.from_dict(good) == tiny()
    with pytest.raises(ConfigError, match="n_head"):
        Architecture.from_dict({**good, "attention": {**good["attention"], "n_head": 4}})
    with pytest.raises(ConfigError, match="n_classes"):
        Architecture(vocab_size=10, objective="classification")


def test_partial_rotary_rotates_only_the_first_features_and_rope_base_changes_them():
    from mhalab.attention import apply_rotary
    from mhalab.model import rotary_tables

    x = torch.randn(1, 2, 5, 8)  # (B, H, T, D)
    cos, sin = rotary_tables(5, 4, 100.0)  # (T, 4)
    y = apply_rotary(x, cos, sin)
    assert torch.equal(y[..., 4:], x[..., 4:]) and not torch.allclose(y[..., :4], x[..., :4])
    assert torch.allclose(rotary_tables(5, 4, 100.0)[0][1, 1], torch.cos(torch.tensor(100.0 ** -0.5)))
    # a model with partial rotary runs and is not the full-rotary model
    full = build_model(tiny(pos="rotary"))
    part = build_model(tiny(pos="rotary", rotary_dim=4))
    part.load_state_dict(full.state_dict())
    ids = torch.randint(5, 50, (2, 9))
    assert not torch.allclose(full.eval()(ids).logits, part.eval()(ids).logits)


def test_param_match_sets_d_ff_to_the_reference_parameter_count():
    from mhalab.cost import encoder_params
    from mhalab.architecture import ParamMatch

    mha = tiny(n_heads=8, d_head=8, d_model=64, d_ff=256)
    mqa = tiny(n_heads=8, n_kv_heads=1, d_head=8, d_model=64, d_ff=256,
               param_match=ParamMatch(n_heads=8, d_head=8))
    assert mqa.model.d_ff > 256 and mqa.model.param_match is None
    # one more d_ff unit adds 2 d_model + 1 parameters in each of the 2 layers: nearest means within half of that
    assert abs(encoder_params(mqa) - encoder_params(mha)) <= 2 * (2 * 64 + 1) / 2


def test_short_conv_mixes_only_the_last_k_positions():
    from mhalab.model import ShortConv

    conv = ShortConv(8, 3)
    x = torch.randn(1, 10, 8)  # (B, T, d_model)
    for t in range(10):
        x2 = x.clone()
        x2[0, t] += 1.0
        moved = (conv(x2) - conv(x)).abs().sum(-1)[0] > 0  # (T,) positions whose output changed
        assert moved.nonzero().flatten().tolist() == [p for p in range(t, min(t + 3, 10))]
    model = LanguageModel(tiny("clm", short_conv=3)).eval()
    ids = torch.randint(5, 50, (1, 8))
    ids2 = ids.clone()
    ids2[0, 5:] = (ids2[0, 5:] + 1) % 50
    assert torch.allclose(model(ids).logits[:, :5], model(ids2).logits[:, :5], atol=1e-5)
