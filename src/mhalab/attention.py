"""The one attention layer every experiment varies: MHA, GQA and MQA with a free head width.

    head_i = softmax(Q_i K_g(i)^T / sqrt(d_head)) V_g(i),   g(i) = i // (n_heads // n_kv_heads)
    out    = Concat(head_1, ..., head_h) W^O

n_kv_heads = n_heads is MHA, 1 is MQA, any other divisor is GQA (contiguous groups, as in HF `repeat_kv`).
d_head is free (Bhojanapalli et al. 2020); d_model // n_heads is only the default.
Every head is reached through the hook points of `mhalab.hooks` (hook_q, hook_k, hook_v, hook_attn_scores,
hook_pattern, hook_z, hook_result). Definitions: docs/definitions.md#the-attention-layer.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from mhalab.checks import check_choice, check_int, check_number
from mhalab.heads import kv_head_of, resolve_heads
from mhalab.hooks import PATTERN_POINTS, call_hooks
from mhalab.architecture import BACKENDS

# Decoding on CUDA names SDPA's backends: with torch's default choice each call whose key length is new (every
# decoding step) cost ~34 ms on an H100, whichever kernel then ran; with the backends named, 0.75-0.82 ms a token
# (scripts/diagnose_decode.py, experiments/gpu/h100-2/decode.md). Training keeps torch's choice (its shapes repeat).
DECODE_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
# Deterministic training in bf16/fp16 on the CPU names SDPA's math backend: with torch's CPU flash kernel for reduced
# precision (oneDNN brgemm on AMX), no two of 90 fresh runs of one bf16 job made the same sequence of kernel calls
# and 1 ended on another result; with the math backend, one sequence and one result (scripts/measure_bf16_repeats.py,
# experiments/determinism). torch flags no CPU kernel as nondeterministic.
DETERMINISTIC_CPU_BACKENDS = [SDPBackend.MATH]


def sdpa_backends(q: Tensor, decoding: bool):
    """The context that names SDPA's backends for this call: DECODE_BACKENDS when decoding on CUDA, the math backend
    for reduced-precision queries on the CPU under torch.use_deterministic_algorithms, else torch's own choice."""
    if decoding and q.is_cuda:
        return sdpa_kernel(DECODE_BACKENDS)
    reduced = q.dtype in (torch.bfloat16, torch.float16)
    if q.device.type == "cpu" and reduced and torch.are_deterministic_algorithms_enabled():
        return sdpa_kernel(DETERMINISTIC_CPU_BACKENDS)
    return contextlib.nullcontext()


class KVCache:
    """A preallocated key/value cache for incremental (causal) decoding of one layer.

    Holds (B, n_kv_heads, max_len, d_head) keys and values; `update` writes the new ones at the
    current length and returns views of everything cached so far.

    dtype None (the default): the cache is allocated at the first `update`, in the dtype and on the device of the
    keys it is given, so it follows the model's device and compute dtype (bf16 under a bf16 autocast, where the
    parameters stay float32, as `mhalab.cost.kv_cache_bytes` with 2 bytes per element prices it). An explicit dtype
    allocates at once (on `device`), stores the keys and values in that dtype and returns them in the queries'.
    """

    def __init__(self, batch_size: int, n_kv_heads: int, max_len: int, d_head: int,
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None):
        self.shape = (batch_size, n_kv_heads, max_len, d_head)
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        if dtype is not None:
            self._allocate(dtype, device)
        self.length = 0

    def _allocate(self, dtype: torch.dtype, device) -> None:
        self.k = torch.zeros(self.shape, dtype=dtype, device=device)
        self.v = torch.zeros(self.shape, dtype=dtype, device=device)

    @property
    def max_len(self) -> int:
        return self.shape[2]

    @property
    def dtype(self) -> torch.dtype | None:
        """The dtype the cache holds; None before the first update of a cache that takes it from its keys."""
        return None if self.k is None else self.k.dtype

    @property
    def nbytes(self) -> int:
        """Bytes held by the filled part of the cache."""
        if self.k is None:
            return 0
        B, G, _, D = self.shape
        return 2 * B * G * self.length * D * self.k.element_size()

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        T = k.shape[2]
        if self.length + T > self.max_len:
            raise ValueError(f"KVCache: {self.length + T} positions exceed max_len={self.max_len}")
        if self.k is None:
            self._allocate(k.dtype, k.device)
        elif k.device != self.k.device:
            raise ValueError(f"KVCache: keys on {k.device} for a cache on {self.k.device}; make the cache on the "
                             "model's device (or with dtype=None, which follows the keys)")
        self.k[:, :, self.length:self.length + T] = k
        self.v[:, :, self.length:self.length + T] = v
        self.length += T
        return self.k[:, :, :self.length], self.v[:, :, :self.length]


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary position embedding (RoFormer, GPT-NeoX layout) on the first R features of each head, the rest passed
    through (partial rotary, as in GPT-NeoX's rotary_pct). x: (B, H, T, D); cos, sin: (T, R), R even, R <= D.
    The result has x's dtype."""
    R = cos.shape[-1]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # keep x's dtype: bf16 under autocast (the float32 tables would
    #   promote the keys, and with them the KV cache, to float32)
    if R == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    rot, rest = x[..., :R], x[..., R:]
    return torch.cat((rot * cos + rotate_half(rot) * sin, rest), dim=-1)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with n_heads query heads and n_kv_heads shared key/value heads.

    Args:
        d_model: width of the input and output.
        n_heads: number of query heads.
        n_kv_heads: number of key/value heads; None = n_heads (MHA), 1 = MQA, a divisor = GQA.
        d_head: width of each head; None = d_model // n_heads.
        bias: bias in the four projections.
        dropout: dropout on the attention weights (training only).
        backend: "sdpa" (torch scaled_dot_product_attention, fast) or "math" (explicit softmax).

    Hook points (`mhalab.hooks`): functions attached to `hook_fns` {point: [(fn, hook)]} read or replace the
    queries, keys, values, scores, pattern, each head's output (`z`, where a head is removed or patched) and each
    head's share of the output (`result`). With none attached the forward pass is the plain one.
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None, d_head: int | None = None,
                 bias: bool = True, dropout: float = 0.0, backend: str = "sdpa"):
        super().__init__()
        check_int("d_model", d_model, 1)
        n_kv_heads, d_head = resolve_heads(d_model, n_heads, n_kv_heads, d_head)
        check_choice("backend", backend, BACKENDS)
        check_number("dropout", dropout, 0, 1, high_open=True)
        self.d_model, self.n_heads, self.n_kv_heads, self.d_head = d_model, n_heads, n_kv_heads, d_head
        self.backend, self.dropout = backend, dropout
        self.q_proj = nn.Linear(d_model, n_heads * d_head, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * d_head, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * d_head, bias=bias)
        self.out_proj = nn.Linear(n_heads * d_head, d_model, bias=bias)
        self.hook_fns: dict[str, list] = {}  # point -> [(fn, Hook)], attached by mhalab.hooks.hooks

    @property
    def group_size(self) -> int:
        """Query heads per KV head."""
        return self.n_heads // self.n_kv_heads

    # Per-head views of the projections, in TransformerLens's layout (writable: they share the Linear's storage).
    @property
    def W_Q(self) -> Tensor:
        """(n_heads, d_model, d_head): query head h is x @ W_Q[h] + b_Q[h] (before rotary)."""
        return self.q_proj.weight.view(self.n_heads, self.d_head, self.d_model).transpose(1, 2)

    @property
    def W_K(self) -> Tensor:
        """(n_kv_heads, d_model, d_head): key head g is x @ W_K[g] + b_K[g]."""
        return self.k_proj.weight.view(self.n_kv_heads, self.d_head, self.d_model).transpose(1, 2)

    @property
    def W_V(self) -> Tensor:
        """(n_kv_heads, d_model, d_head): value head g is x @ W_V[g] + b_V[g]."""
        return self.v_proj.weight.view(self.n_kv_heads, self.d_head, self.d_model).transpose(1, 2)

    @property
    def W_O(self) -> Tensor:
        """(n_heads, d_head, d_model): head h adds z_h @ W_O[h] to the output (hook_result)."""
        return self.out_proj.weight.view(self.d_model, self.n_heads, self.d_head).permute(1, 2, 0)

    def head_bias(self, proj: str) -> Tensor | None:
        """The bias of "q", "k" or "v" per head, (heads, d_head), or None without biases."""
        linear = getattr(self, f"{proj}_proj")
        return None if linear.bias is None else linear.bias.view(-1, self.d_head)

    def kv_head_of(self, head: int) -> int:
        """The KV head that query head `head` reads."""
        return kv_head_of(head, self.n_heads, self.n_kv_heads)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
                f"d_head={self.d_head}, backend={self.backend!r}")

    def forward(self, x: Tensor, kv: Tensor | None = None, key_padding_mask: Tensor | None = None,
                causal: bool = False, need_weights: bool = False, rotary: tuple[Tensor, Tensor] | None = None,
                cache: KVCache | None = None) -> tuple[Tensor, Tensor | None]:
        """Attend from x (B, T, d_model) to kv (B, S, d_model; default x).

        key_padding_mask: (B, S) bool, True = padding (PyTorch's convention); with a cache, S counts every
            cached position. causal: query t sees keys <= t (offset by what the cache already holds).
        rotary: (cos, sin), each (S_total, d_head), applied to queries and keys at their positions.
        cache: a KVCache; new keys/values are appended and attention runs over all cached ones.
        Returns (out (B, T, d_model), weights (B, n_heads, T, S) if need_weights else None).
        """
        B, T, _ = x.shape
        kv = x if kv is None else kv
        past = cache.length if cache is not None else 0
        q = self.q_proj(x).view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, D)
        k = self.k_proj(kv).view(B, kv.shape[1], self.n_kv_heads, self.d_head).transpose(1, 2)  # (B, G, S, D)
        v = self.v_proj(kv).view(B, kv.shape[1], self.n_kv_heads, self.d_head).transpose(1, 2)  # (B, G, S, D)
        if rotary is not None:
            cos, sin = rotary
            q = apply_rotary(q, cos[past:past + T], sin[past:past + T])
            k = apply_rotary(k, cos[past:past + k.shape[2]], sin[past:past + k.shape[2]])
        hooked = bool(self.hook_fns)
        if hooked:  # hooks see TransformerLens's (B, T, heads, D)
            q = call_hooks(self, "q", q.transpose(1, 2)).transpose(1, 2)  # (B, H, T, D)
            k = call_hooks(self, "k", k.transpose(1, 2)).transpose(1, 2)  # (B, G, S, D)
            v = call_hooks(self, "v", v.transpose(1, 2)).transpose(1, 2)  # (B, G, S, D)
        if cache is not None:
            k, v = cache.update(k, v)  # (B, G, past + T, D)
            if k.dtype != q.dtype:  # a cache with its own storage dtype: attend in the queries' dtype
                k, v = k.to(q.dtype), v.to(q.dtype)
        S = k.shape[2]
        mask = self._mask(key_padding_mask, causal, B, T, S, past, x.device)  # (B|1, 1, T|1, S) bool or None
        dropout_p = self.dropout if self.training else 0.0

        plain_causal = causal and key_padding_mask is None and past == 0 and T == S  # every row sees its own key
        if need_weights or self.backend == "math" or (hooked and not PATTERN_POINTS.isdisjoint(self.hook_fns)):
            y, weights = self._math_attention(q, k, v, mask, dropout_p)
            weights = weights if need_weights else None
            plain_causal = False
        else:
            # GQA: enable_gqa, chosen by measurement (scripts/measure_gqa_sdpa.py; figures in docs/performance.md):
            # less memory than repeat_interleave, whose extra is the (B, H, S, D) copy of K and V. Both stay on the
            # fused kernel with a mask (a materialised (B, H, T, S) score matrix would be 1 GiB).
            with sdpa_backends(q, decoding=cache is not None):
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=None if plain_causal else mask,
                                                   is_causal=plain_causal, dropout_p=dropout_p,
                                                   enable_gqa=self.n_kv_heads != self.n_heads)  # (B, H, T, D)
            weights = None
        if mask is not None and not plain_causal:
            # A query row with every key masked (e.g. an all-padding sequence) gives NaN; zero it so it stays inert.
            y = y.nan_to_num(0.0)
        z = y.transpose(1, 2)  # (B, T, H, D)
        if hooked:
            z = call_hooks(self, "z", z)
            if "result" in self.hook_fns:
                return self._result(z), weights
        return self.out_proj(z.reshape(B, T, self.n_heads * self.d_head)), weights  # (B, T, d_model)

    def _result(self, z: Tensor) -> Tensor:
        """The output as the sum of each head's share, through hook_result. z: (B, T, H, D) -> (B, T, d_model)."""
        result = torch.einsum("bthd,hdm->bthm", z, self.W_O.to(z.dtype))  # (B, T, H, d_model)
        result = call_hooks(self, "result", result)
        out = result.sum(2)  # (B, T, d_model)
        return out if self.out_proj.bias is None else out + self.out_proj.bias.to(out.dtype)

    def _mask(self, key_padding_mask: Tensor | None, causal: bool, B: int, T: int, S: int, past: int,
              device: torch.device) -> Tensor | None:
        """Boolean mask, True = may attend, broadcastable to (B, H, T, S); None when nothing is masked."""
        mask = None
        if key_padding_mask is not None:
            if key_padding_mask.dtype != torch.bool or key_padding_mask.shape != (B, S):
                raise ValueError(f"key_padding_mask must be a bool tensor of shape (B, S) = ({B}, {S}), "
                                 f"got {key_padding_mask.dtype} {tuple(key_padding_mask.shape)}")
            mask = ~key_padding_mask.view(B, 1, 1, S)  # (B, 1, 1, S)
        if causal and not (T == 1 and past == S - 1):  # a single new token at the end sees everything
            rows = torch.arange(past, past + T, device=device).view(T, 1)
            allowed = torch.arange(S, device=device).view(1, S) <= rows  # (T, S)
            allowed = allowed.view(1, 1, T, S)
            mask = allowed if mask is None else mask & allowed  # (B, 1, T, S)
        return mask

    def _math_attention(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
                        dropout_p: float) -> tuple[Tensor, Tensor]:
        """Explicit softmax attention; returns (y (B, H, T, D), weights (B, H, T, S)).

        GQA without copying K and V: the query heads of a group are stacked along the rows, (H/G * T) queries
        against their group's one KV head, so no (B, H, S, D) copy of K and V is made (a broadcasting matmul
        would make one).
        """
        B, H, T, D = q.shape
        G, S = self.n_kv_heads, k.shape[2]
        qg = q.reshape(B, G, (H // G) * T, D)  # (B, G, H/G*T, D): heads are contiguous groups, head i in i // (H/G)
        scores = (qg @ k.transpose(-2, -1)).view(B, H, T, S) * (1.0 / math.sqrt(D))  # (B, H, T, S)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        if self.hook_fns:
            scores = call_hooks(self, "attn_scores", scores)
        weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)  # (B, H, T, S)
        if mask is not None:
            weights = weights.nan_to_num(0.0)  # rows with no valid key
        if self.hook_fns:
            weights = call_hooks(self, "pattern", weights)
        attn = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
        y = attn.reshape(B, G, (H // G) * T, S) @ v  # (B, G, H/G*T, D)
        return y.view(B, H, T, D), weights

