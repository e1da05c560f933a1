"""mhalab.cost closed forms against torch's FlopCounterMode and parameter counts."""

import pytest
import torch

from mhalab.attention import MultiHeadAttention
from mhalab.cost import (attention_flops, attention_params, encoder_flops, encoder_params, kv_cache_bytes,
                         measured_flops, model_cost)
from conftest import arch

from mhalab.model import build_model

SHAPES = [  # d_model, n_heads, n_kv_heads, d_head, n
    (64, 4, 4, 16, 10),  # MHA, d_head = d_model / n_heads
    (64, 8, 2, 24, 7),  # GQA, d_head != d_model / n_heads
    (48, 6, 1, 5, 13),  # MQA, odd d_head
    (32, 1, 1, 32, 5),  # one head
    (32, 16, 4, 64, 3),  # n_heads * d_head > d_model
]


@pytest.mark.parametrize("backend", ["sdpa", "math"])
@pytest.mark.parametrize("d_model,n_heads,n_kv_heads,d_head,n", SHAPES)
def test_attention_flops_equal_flop_counter(backend, d_model, n_heads, n_kv_heads, d_head, n):
    attn = MultiHeadAttention(d_model, n_heads, n_kv_heads, d_head, backend=backend)
    x = torch.randn(3, n, d_model)
    counted = measured_flops(attn, x)
    assert counted == 3 * attention_flops(n, d_model, n_heads, d_head, n_kv_heads)["total"]


def test_cross_attention_flops_use_the_key_count():
    attn = MultiHeadAttention(32, 4, 2, 12, backend="math")
    counted = measured_flops(attn, torch.randn(1, 5, 32), kv=torch.randn(1, 9, 32))
    assert counted == attention_flops(5, 32, 4, 12, 2, n_keys=9)["total"]


def test_equal_cost_claim_in_closed_form():
    """8 heads of 64 cost one head of 512 (matmul FLOPs, fixed n_heads * d_head)."""
    one = attention_flops(128, 512, 1, 512)["total"]
    assert all(attention_flops(128, 512, h, 512 // h)["total"] == one for h in (2, 4, 8, 16, 32))


@pytest.mark.parametrize("objective", ["classification", "mlm"])
@pytest.mark.parametrize("kw", [dict(), dict(n_kv_heads=1, d_head=12, pos="rotary"), dict(norm="post", bias=False),
                                dict(short_conv=3)])
def test_model_params_and_flops(objective, kw):
    a = arch(300, objective, 5 if objective == "classification" else None, max_len=64, d_model=32, n_layers=2,
             n_heads=4, d_ff=80, **kw)
    model = build_model(a)
    assert sum(p.numel() for p in model.parameters()) == encoder_params(a)
    ids = torch.randint(0, 300, (2, 20))
    assert measured_flops(model, ids) == 2 * encoder_flops(a, 20)["total"]


def test_attention_params_match_module():
    for bias in (True, False):
        attn = MultiHeadAttention(40, 8, 2, 7, bias=bias)
        assert sum(p.numel() for p in attn.parameters()) == attention_params(40, 8, 7, 2, bias)


def test_kv_cache_bytes():
    assert kv_cache_bytes(n_kv_heads=8, d_head=64, bytes_per_element=2) == 2048
    assert kv_cache_bytes(1, 64, 2) * 8 == kv_cache_bytes(8, 64, 2)  # MQA: 1/8 of MHA
    assert kv_cache_bytes(2, 16, 4, n_tokens=10, n_layers=3, batch_size=2) == 2 * 2 * 16 * 4 * 10 * 3 * 2
    a = arch(10, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2)
    assert model_cost(a, 16)["kv_cache_bytes_per_token"] == 3 * 2 * 2 * 8 * 4
