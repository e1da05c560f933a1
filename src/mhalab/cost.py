"""Closed-form cost of the attention layer and the encoder: parameters, forward FLOPs, KV-cache bytes.

Conventions (docs/definitions.md#cost-model): one sequence of n tokens, forward pass, a multiply-add = 2 FLOPs,
matmuls only (bias adds, softmax, norms and GELU are not counted, as torch's FlopCounterMode does not count them).
The one place these numbers come from: training logs, MFU and the benchmarks all call it.
"""

from __future__ import annotations

from mhalab.model import EncoderConfig


def attention_flops(n: int, d_model: int, n_heads: int, d_head: int, n_kv_heads: int | None = None,
                    n_keys: int | None = None) -> dict[str, int]:
    """Forward FLOPs of one attention layer for n queries over n_keys keys (default n; self-attention).

    Returns the parts (q_proj, k_proj, v_proj, scores, weighted_values, out_proj) and their `total`.
    """
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    s = n if n_keys is None else n_keys
    parts = {
        "q_proj": 2 * n * d_model * n_heads * d_head,
        "k_proj": 2 * s * d_model * n_kv_heads * d_head,
        "v_proj": 2 * s * d_model * n_kv_heads * d_head,
        "scores": 2 * n * s * n_heads * d_head,  # Q K^T
        "weighted_values": 2 * n * s * n_heads * d_head,  # weights V
        "out_proj": 2 * n * n_heads * d_head * d_model,
    }
    parts["total"] = sum(parts.values())
    return parts


def attention_params(d_model: int, n_heads: int, d_head: int, n_kv_heads: int | None = None, bias: bool = True) -> int:
    """Parameters of one attention layer (four projections)."""
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    q, kv = n_heads * d_head, n_kv_heads * d_head
    weights = d_model * q + 2 * d_model * kv + q * d_model
    biases = (q + 2 * kv + d_model) if bias else 0
    return weights + biases


def kv_cache_bytes(n_kv_heads: int, d_head: int, bytes_per_element: int = 4, n_tokens: int = 1,
                   n_layers: int = 1, batch_size: int = 1) -> int:
    """KV-cache size: 2 (K and V) * n_kv_heads * d_head * bytes per token per layer, times tokens, layers, batch."""
    return 2 * n_kv_heads * d_head * bytes_per_element * n_tokens * n_layers * batch_size


def feedforward_flops(n: int, d_model: int, d_ff: int) -> int:
    return 2 * 2 * n * d_model * d_ff


def encoder_flops(cfg: EncoderConfig, n: int, objective: str = "classification", n_classes: int = 2) -> dict[str, int]:
    """Forward FLOPs of the whole model on one sequence of n tokens.

    Parts: attention (all layers), feedforward (all layers), head (classifier on one pooled vector, or the
    LM transform plus output layer at every position), total; and `per_token` = total / n.
    """
    attn = cfg.n_layers * attention_flops(n, cfg.d_model, cfg.n_heads, cfg.d_head, cfg.n_kv_heads)["total"]
    ff = cfg.n_layers * feedforward_flops(n, cfg.d_model, cfg.d_ff)
    if objective == "classification":
        head = 2 * cfg.d_model * n_classes
    else:
        head = 2 * n * cfg.d_model * cfg.d_model + 2 * n * cfg.d_model * cfg.vocab_size
    total = attn + ff + head
    return {"attention": attn, "feedforward": ff, "head": head, "total": total, "per_token": total / n}


def encoder_params(cfg: EncoderConfig, objective: str = "classification", n_classes: int = 2,
                   pooling: str = "cls", tie_weights: bool = True) -> int:
    """Trainable parameters of `build_model(cfg, objective, n_classes)` (closed form; the tests check it)."""
    d, b = cfg.d_model, int(cfg.bias)
    embed = cfg.vocab_size * d + (cfg.max_len * d if cfg.pos == "learned" else 0)
    block = (attention_params(d, cfg.n_heads, cfg.d_head, cfg.n_kv_heads, cfg.bias)
             + (d * cfg.d_ff + b * cfg.d_ff) + (cfg.d_ff * d + b * d)  # feed-forward
             + 2 * 2 * d)  # two LayerNorms
    final_norm = 2 * d if cfg.norm == "pre" else 0
    if objective == "classification":
        head = d * n_classes + n_classes
    else:
        head = (d * d + d) + 2 * d + cfg.vocab_size + (0 if tie_weights else cfg.vocab_size * d)
    return embed + cfg.n_layers * block + final_norm + head


def model_cost(cfg: EncoderConfig, seq_len: int, objective: str = "classification", n_classes: int = 2,
               bytes_per_element: int = 4) -> dict[str, float]:
    """The figures a run logs: parameters, forward FLOPs per token at seq_len, KV-cache bytes per token."""
    return {
        "params": encoder_params(cfg, objective, n_classes),
        "flops_per_token": encoder_flops(cfg, seq_len, objective, n_classes)["per_token"],
        "attention_flops_per_token": encoder_flops(cfg, seq_len, objective, n_classes)["attention"] / seq_len,
        "kv_cache_bytes_per_token": kv_cache_bytes(cfg.n_kv_heads, cfg.d_head, bytes_per_element,
                                                   n_layers=cfg.n_layers),
    }


def measured_flops(fn, *args, **kwargs) -> int:
    """FLOPs that torch.utils.flop_counter.FlopCounterMode counts for fn(*args, **kwargs), forward and backward
    alike.

    FlopCounterMode has no formula for the CPU fused SDPA kernel (it counts 0 there), so this registers torch's
    own SDPA formula for it; the count then matches the closed form on every backend.
    """
    import torch
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten
    mapping = {}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        mapping[aten._scaled_dot_product_flash_attention_for_cpu] = _sdpa_cpu_flop
        mapping[aten._scaled_dot_product_flash_attention_for_cpu_backward] = _sdpa_cpu_backward_flop
    counter = fc.FlopCounterMode(display=False, custom_mapping=mapping)
    with counter:
        fn(*args, **kwargs)
    return counter.get_total_flops()


def _sdpa_cpu_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    from torch.utils import flop_counter as fc

    return fc.sdpa_flop_count(query_shape, key_shape, value_shape)


def _sdpa_cpu_backward_flop(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
    from torch.utils import flop_counter as fc

    return fc.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)
