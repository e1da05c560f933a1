"""A small transformer encoder built around `MultiHeadAttention`, and its task heads.

    tokens -> embedding (+ learned | sinusoidal positions; rotary acts inside attention) -> dropout
           -> n_layers x Block (pre-LN or post-LN; attention + GELU feed-forward) -> final norm
           -> SequenceClassifier (first-token [CLS] or mean pooling) | LanguageModel (tied LM head)
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mhalab.attention import KVCache, MultiHeadAttention
from mhalab.architecture import Architecture


@contextlib.contextmanager
def eval_mode(module: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """`module.eval()` for the duration, then its previous mode back (also after an error)."""
    was_training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was_training)


def sinusoidal_table(max_len: int, d_model: int) -> Tensor:
    """Vaswani et al. 2017 fixed positions: (max_len, d_model)."""
    pos = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)
    inv = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(pos * inv)
    table[:, 1::2] = torch.cos(pos * inv[: d_model // 2])
    return table


def rotary_tables(max_len: int, rotary_dim: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """cos and sin tables (max_len, rotary_dim) for rotary positions (Su et al. 2021, NeoX half-split layout):
    rotary_dim / 2 frequencies base^(-2i / rotary_dim). A head of width d_head rotates its first rotary_dim features."""
    inv = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)  # (R/2,)
    angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv)  # (max_len, R/2)
    angles = torch.cat((angles, angles), dim=-1)  # (max_len, R)
    return angles.cos(), angles.sin()


class ShortConv(nn.Module):
    """A causal depthwise convolution over time (Zoology's short convolution): position t mixes, per feature,
    positions t-k+1 .. t. Padding sits on the left, so no position sees the future."""

    def __init__(self, d_model: int, kernel: int):
        super().__init__()
        self.kernel = kernel
        self.conv = nn.Conv1d(d_model, d_model, kernel, groups=d_model)

    def forward(self, x: Tensor) -> Tensor:
        y = F.pad(x.transpose(1, 2), (self.kernel - 1, 0))  # (B, d_model, k-1+T)
        return self.conv(y).transpose(1, 2)  # (B, T, d_model)


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float, bias: bool):
        super().__init__()
        self.fc = nn.Linear(d_model, d_ff, bias=bias)
        self.proj = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """One encoder block. pre-LN: x + f(LN(x)); post-LN (Vaswani et al. 2017): LN(x + f(x))."""

    def __init__(self, arch: Architecture):
        super().__init__()
        m, a = arch.model, arch.attention
        self.norm_first = m.norm == "pre"
        self.attn = MultiHeadAttention(m.d_model, a.n_heads, a.n_kv_heads, a.d_head, bias=m.bias, dropout=a.dropout,
                                       backend=a.backend)
        self.ln1 = nn.LayerNorm(m.d_model)
        self.ln2 = nn.LayerNorm(m.d_model)
        self.ff = FeedForward(m.d_model, m.d_ff, m.dropout, m.bias)
        self.dropout = nn.Dropout(m.dropout)

    def forward(self, x: Tensor, padding_mask: Tensor | None, causal: bool, rotary: tuple[Tensor, Tensor] | None,
                cache: KVCache | None) -> Tensor:
        h = self.ln1(x) if self.norm_first else x
        a, _ = self.attn(h, key_padding_mask=padding_mask, causal=causal, rotary=rotary, cache=cache)
        x = x + self.dropout(a)
        if not self.norm_first:
            x = self.ln1(x)
        x = x + self.ff(self.ln2(x) if self.norm_first else x)
        if not self.norm_first:
            x = self.ln2(x)
        return x  # (B, T, d_model)


@dataclass
class EncoderOutput:
    hidden: Tensor  # (B, T, d_model)


class Encoder(nn.Module):
    """Token embedding, positions, n_layers blocks and a final norm (pre-LN only; post-LN blocks end normed)."""

    def __init__(self, arch: Architecture):
        super().__init__()
        self.arch = arch
        m, a = arch.model, arch.attention
        self.tok_emb = nn.Embedding(arch.vocab_size, m.d_model)
        if m.pos == "learned":
            self.pos_emb = nn.Embedding(m.max_len, m.d_model)
        elif m.pos == "sinusoidal":
            self.register_buffer("pos_table", sinusoidal_table(m.max_len, m.d_model), persistent=False)
        else:
            cos, sin = rotary_tables(m.max_len, m.rotary_dim or a.d_head, m.rope_base)
            self.register_buffer("rotary_cos", cos, persistent=False)
            self.register_buffer("rotary_sin", sin, persistent=False)
        self.drop = nn.Dropout(m.dropout)
        self.short_conv = ShortConv(m.d_model, m.short_conv) if m.short_conv else None
        self.blocks = nn.ModuleList(Block(arch) for _ in range(m.n_layers))
        self.ln_f = nn.LayerNorm(m.d_model) if m.norm == "pre" else nn.Identity()
        self.apply(_init_weights)

    def attention_layers(self) -> list[MultiHeadAttention]:
        return [b.attn for b in self.blocks]

    def new_caches(self, batch_size: int, max_len: int | None = None, dtype: torch.dtype | None = None) -> list[KVCache]:
        """One empty KVCache per layer, for incremental decoding with `causal=True`. dtype None: each cache takes the
        dtype and device of the keys it first stores (the model's compute dtype: bf16 under a bf16 autocast); else
        that dtype on the model's device."""
        a, p = self.arch.attention, self.tok_emb.weight
        return [KVCache(batch_size, a.n_kv_heads, max_len or self.arch.model.max_len, a.d_head, dtype,
                        p.device if dtype is not None else None) for _ in range(self.arch.model.n_layers)]

    def forward(self, input_ids: Tensor, padding_mask: Tensor | None = None,
                caches: list[KVCache] | None = None) -> EncoderOutput:
        """input_ids (B, T) long; padding_mask (B, T) bool, True = padding. With caches, input_ids are the
        next T tokens after what the caches hold (and padding_mask, if given, covers all cached positions).
        Attention weights and every head's internals: `mhalab.hooks.run_with_cache`."""
        B, T = input_ids.shape
        start = caches[0].length if caches else 0
        if start + T > self.arch.model.max_len:
            raise ValueError(f"sequence of {start + T} tokens exceeds model.max_len={self.arch.model.max_len}")
        x = self.tok_emb(input_ids)  # (B, T, d_model)
        rotary = None
        if self.arch.model.pos == "learned":
            x = x + self.pos_emb(torch.arange(start, start + T, device=input_ids.device))
        elif self.arch.model.pos == "sinusoidal":
            x = x + self.pos_table[start:start + T]
        else:
            rotary = (self.rotary_cos, self.rotary_sin)
        x = self.drop(x)
        if self.short_conv is not None:
            if caches:
                raise ValueError("model.short_conv does not support KV-cache decoding")
            x = x + self.short_conv(x)  # (B, T, d_model)
        for i, block in enumerate(self.blocks):
            x = block(x, padding_mask, self.arch.causal, rotary, caches[i] if caches else None)
        return EncoderOutput(self.ln_f(x))


def _init_weights(module: nn.Module) -> None:
    """BERT / nanoGPT initialisation: N(0, 0.02) weights, zero biases."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


@dataclass
class ModelOutput:
    logits: Tensor  # (B, n_classes) or (B, T, vocab_size)


class SequenceClassifier(nn.Module):
    """Encoder + pooling (model.pooling "cls": the first token; "mean": over non-padding tokens) + linear classifier."""

    def __init__(self, arch: Architecture):
        super().__init__()
        self.encoder = Encoder(arch)
        self.pooling = arch.model.pooling
        self.classifier = nn.Linear(arch.model.d_model, arch.n_classes)
        _init_weights(self.classifier)

    def attention_layers(self) -> list[MultiHeadAttention]:
        return self.encoder.attention_layers()

    def forward(self, input_ids: Tensor, padding_mask: Tensor | None = None) -> ModelOutput:
        out = self.encoder(input_ids, padding_mask)
        h = out.hidden  # (B, T, d_model)
        if self.pooling == "cls":
            pooled = h[:, 0]  # (B, d_model)
        else:
            keep = torch.ones_like(h[..., 0]) if padding_mask is None else (~padding_mask).to(h.dtype)  # (B, T)
            pooled = (h * keep.unsqueeze(-1)).sum(1) / keep.sum(1, keepdim=True).clamp_min(1.0)  # (B, d_model)
        return ModelOutput(self.classifier(pooled))


class LanguageModel(nn.Module):
    """Encoder + token-level LM head (dense-GELU-LayerNorm transform as in BERT, then an output layer tied to the
    token embedding). Masked LM with a bidirectional encoder, next-token LM with `causal=True`."""

    def __init__(self, arch: Architecture):
        super().__init__()
        d = arch.model.d_model
        self.encoder = Encoder(arch)
        self.transform = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d))
        self.lm_head = nn.Linear(d, arch.vocab_size)
        self.transform.apply(_init_weights)
        _init_weights(self.lm_head)
        if arch.model.tie_weights:
            self.lm_head.weight = self.encoder.tok_emb.weight

    def attention_layers(self) -> list[MultiHeadAttention]:
        return self.encoder.attention_layers()

    def forward(self, input_ids: Tensor, padding_mask: Tensor | None = None,
                caches: list[KVCache] | None = None) -> ModelOutput:
        out = self.encoder(input_ids, padding_mask, caches)
        return ModelOutput(self.lm_head(self.transform(out.hidden)))  # (B, T, vocab_size)


def build_model(arch: Architecture) -> SequenceClassifier | LanguageModel:
    """The model for an architecture's objective: classification -> SequenceClassifier; mlm / clm -> LanguageModel."""
    return SequenceClassifier(arch) if arch.objective == "classification" else LanguageModel(arch)
