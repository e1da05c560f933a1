"""Closed-form cost of the attention layer and the encoder: parameters, forward FLOPs, KV-cache bytes.

Conventions (docs/definitions.md#cost-model): one sequence of n tokens, forward pass, a multiply-add = 2 FLOPs,
matmuls only (bias adds, softmax, norms and GELU are not counted, as torch's FlopCounterMode does not count them).
The one place these numbers come from: training logs, MFU and the benchmarks all call it. `arch` is an
`mhalab.architecture.Architecture` (this module imports none of mhalab: the architecture imports it).
"""

from __future__ import annotations


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


def precision_bytes(precision: str) -> int:
    """Bytes per element of the activations (and so the KV cache, which takes the keys' dtype) under a Lightning
    precision: 2 for the 16-bit ones (mixed or true), 8 for 64, else 4."""
    p = str(precision)
    return 2 if p.startswith(("16", "bf16")) else 8 if p.startswith("64") else 4


def matmul_flops(m: int, k: int, n: int) -> int:
    """An (m, k) @ (k, n) product: m * n dot products of length k, a multiply-add each."""
    return 2 * m * k * n


def feedforward_flops(n: int, d_model: int, d_ff: int) -> int:
    return 2 * 2 * n * d_model * d_ff


def encoder_flops(arch, n: int) -> dict[str, int]:
    """Forward FLOPs of the whole model on one sequence of n tokens.

    Parts: attention (all layers), feedforward (all layers), head (classifier on one pooled vector, or the
    LM transform plus output layer at every position), total; and `per_token` = total / n.
    """
    m, a = arch.model, arch.attention
    attn = m.n_layers * attention_flops(n, m.d_model, a.n_heads, a.d_head, a.n_kv_heads)["total"]
    ff = m.n_layers * feedforward_flops(n, m.d_model, m.d_ff) + 2 * n * m.d_model * m.short_conv
    if arch.objective == "classification":
        head = 2 * m.d_model * arch.n_classes
    else:
        head = 2 * n * m.d_model * m.d_model + 2 * n * m.d_model * arch.vocab_size
    total = attn + ff + head
    return {"attention": attn, "feedforward": ff, "head": head, "total": total, "per_token": total / n}


def encoder_params(arch) -> int:
    """Trainable parameters of `build_model(arch)` (closed form; the tests check it)."""
    m, a = arch.model, arch.attention
    d, b = m.d_model, int(m.bias)
    embed = arch.vocab_size * d + (m.max_len * d if m.pos == "learned" else 0) + (m.short_conv + 1) * d * (
        m.short_conv > 0)
    block = (attention_params(d, a.n_heads, a.d_head, a.n_kv_heads, m.bias)
             + (d * m.d_ff + b * m.d_ff) + (m.d_ff * d + b * d)  # feed-forward
             + 2 * 2 * d)  # two LayerNorms
    final_norm = 2 * d if m.norm == "pre" else 0
    if arch.objective == "classification":
        head = d * arch.n_classes + arch.n_classes
    else:
        head = (d * d + d) + 2 * d + arch.vocab_size + (0 if m.tie_weights else arch.vocab_size * d)
    return embed + m.n_layers * block + final_norm + head


def model_cost(arch, seq_len: int, bytes_per_element: int = 4) -> dict[str, float]:
    """The figures a run logs: parameters, forward FLOPs per token at seq_len, KV-cache bytes per token."""
    flops = encoder_flops(arch, seq_len)
    return {
        "params": encoder_params(arch),
        "flops_per_token": flops["per_token"],
        "attention_flops_per_token": flops["attention"] / seq_len,
        "kv_cache_bytes_per_token": kv_cache_bytes(arch.attention.n_kv_heads, arch.attention.d_head,
                                                   bytes_per_element, n_layers=arch.model.n_layers),
    }


def memory_estimate(train_cfg) -> int:
    """Bytes a training run needs at least, before any data is read (a `mhalab.config.schema.TrainConfig`): see
    `training_bytes`. Deliberately a lower bound: it refuses what cannot fit, not what might not."""
    d = train_cfg.data
    vocab = max(d.vocab_size, 261)  # bpe trains at most vocab_size tokens; byte-level has 261
    arch = train_cfg.architecture(vocab, d.objective or "classification", max(2, d.n_classes or 2))
    probe = train_cfg.stats.probe_size if train_cfg.stats.enabled else 0
    return training_bytes(arch, d.batch_size, d.max_len, probe)


def training_bytes(arch, batch_size: int, seq_len: int, probe_size: int = 0) -> int:
    """Bytes of float32 training at least: parameters, gradients and AdamW's two moments, the positional tables,
    the activations of one batch (about 16 d_model + 2 d_ff + 3 H*D floats per token per layer, plus the logits of
    a language model) and the (H, T, T) weights per layer that a statistics probe of probe_size examples holds."""
    m, a = arch.model, arch.attention
    tables = (2 * m.max_len * a.d_head if m.pos == "rotary" else m.max_len * m.d_model if m.pos == "sinusoidal"
              else 0)
    B, T = batch_size, seq_len
    per_token_layer = 16 * m.d_model + 2 * m.d_ff + 3 * a.n_heads * a.d_head
    lm_logits = B * T * arch.vocab_size * int(arch.objective != "classification")
    activations = B * T * m.n_layers * per_token_layer + lm_logits
    probe = probe_size * a.n_heads * T * T * m.n_layers
    return 4 * (4 * encoder_params(arch) + tables + activations + probe)


def train_flops(arch, n: int) -> int:
    """Forward+backward FLOPs of the whole model on one sequence of n tokens: 3x the forward matmuls (the backward
    computes the gradients of inputs and weights, two matmuls per forward one). Model FLOPs, as MFU counts them."""
    return 3 * encoder_flops(arch, n)["total"]


def attention_train_flops(n: int, d_model: int, n_heads: int, d_head: int, n_kv_heads: int | None = None,
                          recompute_scores: bool = False) -> int:
    """Forward+backward FLOPs of one attention layer on one sequence, input gradient included: 3x the forward, plus
    one more Q K^T when the backward recomputes the scores instead of storing them (the fused SDPA kernels)."""
    fwd = attention_flops(n, d_model, n_heads, d_head, n_kv_heads)
    return 3 * fwd["total"] + (fwd["scores"] if recompute_scores else 0)


def attention_score_bytes(n: int, n_heads: int, bytes_per_element: int = 4, n_keys: int | None = None,
                          batch_size: int = 1) -> int:
    """Bytes of one (B, n_heads, n, n_keys) score or weight tensor: what the math path materialises per step."""
    return batch_size * n_heads * n * (n if n_keys is None else n_keys) * bytes_per_element


def attention_peak_bytes(n: int, d_model: int, n_heads: int, d_head: int, backend: str, bytes_per_element: int = 4,
                         batch_size: int = 1) -> int:
    """A rough upper estimate of one attention layer's forward+backward peak beyond its parameters: about 12
    (B, n, max(d_model, H*D)) activations, and on the math path per score element the scores, their scaled copy,
    a float32 copy, the float32 softmax and its cast back (3 * bytes_per_element + 8 bytes). Fused kernels keep
    no (n, n) tensor. Used to skip cases that would not fit."""
    act = 12 * batch_size * n * max(d_model, n_heads * d_head) * bytes_per_element
    scores = attention_score_bytes(n, n_heads, 3 * bytes_per_element + 8, batch_size=batch_size)
    return act + (scores if backend == "math" else 0)


def decode_step_bytes(arch, n_tokens: int, batch_size: int = 1, bytes_per_element: int = 4) -> int:
    """The fewest bytes one incremental-decoding step must read: every weight once (the tied LM head reads the whole
    token embedding) except the positional table, of which one row is used, plus the whole KV cache of n_tokens."""
    m, a = arch.model, arch.attention
    weights = encoder_params(arch) - (m.max_len * m.d_model if m.pos == "learned" else 0)
    cache = kv_cache_bytes(a.n_kv_heads, a.d_head, bytes_per_element, n_tokens, m.n_layers, batch_size)
    return weights * bytes_per_element + cache


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
