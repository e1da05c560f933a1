"""The encoder and its heads: shapes, positions, norms, attention weights on request, KV-cache decoding."""

import pytest
import torch

from mhalab.errors import ConfigError
from mhalab.model import EncoderConfig, LanguageModel, SequenceClassifier, build_model

torch.manual_seed(0)


def tiny(**kw) -> EncoderConfig:
    base = dict(vocab_size=50, max_len=32, d_model=32, n_layers=2, n_heads=4, d_ff=64, dropout=0.0)
    base.update(kw)
    return EncoderConfig(**base)


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rotary"])
@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_classifier_shapes_and_attentions(pos, norm, pooling):
    model = SequenceClassifier(tiny(pos=pos, norm=norm, n_kv_heads=2, d_head=6), n_classes=5, pooling=pooling)
    ids = torch.randint(0, 50, (3, 10))
    pad = torch.arange(10).view(1, 10) >= torch.tensor([10, 7, 4]).view(3, 1)
    out = model(ids, pad, need_weights=True)
    assert out.logits.shape == (3, 5)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (3, 4, 10, 10)
    assert torch.all(out.attentions[1][2, :, :, 4:] == 0)
    assert model(ids, pad).attentions is None
    # padded tokens do not change the prediction
    ids2 = ids.clone()
    ids2[2, 4:] = (ids2[2, 4:] + 1) % 50
    assert torch.allclose(model(ids2, pad).logits, out.logits, atol=1e-5)


def test_mean_pooling_ignores_padding_and_cls_uses_first_token():
    cfg = tiny()
    mean = SequenceClassifier(cfg, 3, "mean").eval()
    h = mean.encoder(torch.randint(0, 50, (1, 6))).hidden
    assert h.shape == (1, 6, 32)
    with pytest.raises(ConfigError, match="pooling"):
        SequenceClassifier(cfg, 3, "max")


def test_backends_give_the_same_model_output():
    model = build_model(tiny(n_kv_heads=1, pos="rotary"), "mlm").eval()
    ids = torch.randint(0, 50, (2, 12))
    a = model(ids).logits
    for layer in model.attention_layers():
        layer.backend = "math"
    assert torch.allclose(a, model(ids).logits, atol=1e-5)


def test_lm_head_is_tied_to_the_embedding():
    model = LanguageModel(tiny())
    assert model.lm_head.weight is model.encoder.tok_emb.weight
    assert model(torch.randint(0, 50, (2, 7))).logits.shape == (2, 7, 50)
    untied = LanguageModel(tiny(), tie_weights=False)
    assert untied.lm_head.weight is not untied.encoder.tok_emb.weight


def test_sequence_longer_than_positional_table_is_refused():
    model = build_model(tiny(max_len=8), "classification", n_classes=2)
    with pytest.raises(ValueError, match="max_len"):
        model(torch.randint(0, 50, (1, 9)))


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "rotary"])
def test_kv_cache_decoding_gives_full_forward_logits(pos):
    model = LanguageModel(tiny(pos=pos, causal=True, n_kv_heads=2)).eval()
    ids = torch.randint(0, 50, (2, 9))
    full = model(ids).logits
    caches = model.encoder.new_caches(2)
    logits = [model(ids[:, :4], caches=caches).logits]
    logits += [model(ids[:, t:t + 1], caches=caches).logits for t in range(4, 9)]
    assert torch.allclose(torch.cat(logits, 1), full, atol=1e-5)
    assert caches[0].length == 9


def test_causal_model_does_not_see_the_future():
    model = LanguageModel(tiny(causal=True)).eval()
    ids = torch.randint(0, 50, (1, 8))
    ids2 = ids.clone()
    ids2[0, 5:] = (ids2[0, 5:] + 1) % 50
    assert torch.allclose(model(ids).logits[:, :5], model(ids2).logits[:, :5], atol=1e-5)


@pytest.mark.parametrize("kw,key", [
    (dict(n_heads=8, n_kv_heads=3), "n_kv_heads"),
    (dict(norm="sandwich"), "model.norm"),
    (dict(pos="alibi"), "model.pos"),
    (dict(n_layers=0), "model.n_layers"),
    (dict(pos="rotary", d_head=5), "d_head"),
    (dict(backend="xformers"), "backend"),
])
def test_config_errors_name_the_key(kw, key):
    with pytest.raises(ConfigError, match=key):
        tiny(**kw)


def test_unknown_model_key_is_refused():
    with pytest.raises(ConfigError, match="n_head"):
        EncoderConfig.from_dict(dict(vocab_size=10, n_head=4))
