"""TransformerLens's ways of indexing an activation cache: (point, layer), (point, layer, layer type), TL's
aliases of the attention points and negative layers all reach the same tensor as the full hook name."""

import pytest
import torch

from mhalab.hooks import ActivationCache, act_name


def cache():
    c = ActivationCache()
    for layer in range(3):
        for point in ("q", "k", "v", "attn_scores", "pattern", "z"):
            c[act_name(point, layer)] = torch.full((1,), 10.0 * layer + len(point))
    return c


@pytest.mark.parametrize("key, name", [
    (("pattern", 0, "attn"), "blocks.0.attn.hook_pattern"),
    (("pattern", 1, "a"), "blocks.1.attn.hook_pattern"),
    (("attn", 2), "blocks.2.attn.hook_pattern"),
    (("attn_logits", 0, "attn"), "blocks.0.attn.hook_attn_scores"),
    (("query", 1), "blocks.1.attn.hook_q"),
    (("key", 1), "blocks.1.attn.hook_k"),
    (("value", 0), "blocks.0.attn.hook_v"),
    (("hook_z", -1), "blocks.2.attn.hook_z"),
    (("pattern", -3, "attn"), "blocks.0.attn.hook_pattern"),
])
def test_transformerlens_index_forms(key, name):
    c = cache()
    assert c[key] is c[name]


def test_a_layer_type_without_hook_points_is_refused_by_name():
    with pytest.raises(KeyError, match="layer type 'mlp'"):
        cache()["pattern", 0, "mlp"]
    with pytest.raises(ValueError, match="unknown hook point 'resid_pre'"):
        cache()["resid_pre", 0]
