"""A small transformer encoder built around `MultiHeadAttention`, and its task heads.

    tokens -> embedding (+ learned | sinusoidal positions; rotary acts inside attention) -> dropout
           -> n_layers x Block (pre-LN or post-LN; attention + GELU feed-forward) -> final norm
           -> SequenceClassifier (first-token [CLS] or mean pooling) | LanguageModel (tied LM head)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mhalab.attention import KVCache, MultiHeadAttention
from mhalab.errors import ConfigError

NORMS = ("pre", "post")
POSITIONS = ("learned", "sinusoidal", "rotary")
POOLINGS = ("cls", "mean")


@dataclass
class EncoderConfig:
    vocab_size: int
    max_len: int = 512
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int | None = None  # None = n_heads (MHA); 1 = MQA; a divisor = GQA
    d_head: int | None = None  # None = d_model // n_heads
    d_ff: int = 512
    dropout: float = 0.1  # embeddings, residual branches, feed-forward
    attn_dropout: float = 0.0  # on attention weights
    norm: str = "pre"  # pre | post
    pos: str = "learned"  # learned | sinusoidal | rotary
    backend: str = "sdpa"  # sdpa | math
    bias: bool = True
    causal: bool = False  # True: each position sees only itself and the past (next-token objectives)

    def __post_init__(self):
        for name in ("vocab_size", "max_len", "d_model", "n_layers", "d_ff"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"model.{name}={value!r}: {name} must be a positive integer")
        if self.norm not in NORMS:
            raise ConfigError(f"model.norm={self.norm!r}: norm must be one of {', '.join(NORMS)}")
        if self.pos not in POSITIONS:
            raise ConfigError(f"model.pos={self.pos!r}: pos must be one of {', '.join(POSITIONS)}")
        for name in ("dropout", "attn_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"model.{name}={getattr(self, name)!r}: {name} must be in [0, 1)")
        # The attention layer checks n_heads / n_kv_heads / d_head / backend; build one on the meta device.
        with torch.device("meta"):
            attn = MultiHeadAttention(self.d_model, self.n_heads, self.n_kv_heads, self.d_head, backend=self.backend)
        self.n_kv_heads, self.d_head = attn.n_kv_heads, attn.d_head
        if self.pos == "rotary" and self.d_head % 2:
            raise ConfigError(f"attention.d_head={self.d_head} with model.pos=rotary: rotary positions need an even d_head")

    @classmethod
    def from_dict(cls, d: dict) -> "EncoderConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown model key(s) {', '.join(unknown)}: allowed keys are {', '.join(sorted(known))}")
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)


def sinusoidal_table(max_len: int, d_model: int) -> Tensor:
    """Vaswani et al. 2017 fixed positions: (max_len, d_model)."""
    pos = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)
    inv = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(pos * inv)
    table[:, 1::2] = torch.cos(pos * inv[: d_model // 2])
    return table


def rotary_tables(max_len: int, d_head: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """cos and sin tables (max_len, d_head) for rotary positions (Su et al. 2021, NeoX half-split layout)."""
    inv = 1.0 / base ** (torch.arange(0, d_head, 2, dtype=torch.float32) / d_head)  # (D/2,)
    angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv)  # (max_len, D/2)
    angles = torch.cat((angles, angles), dim=-1)  # (max_len, D)
    return angles.cos(), angles.sin()


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

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.norm_first = cfg.norm == "pre"
        self.attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_head, bias=cfg.bias,
                                       dropout=cfg.attn_dropout, backend=cfg.backend)
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.ff = FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout, cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, padding_mask: Tensor | None, causal: bool, need_weights: bool,
                rotary: tuple[Tensor, Tensor] | None, cache: KVCache | None) -> tuple[Tensor, Tensor | None]:
        h = self.ln1(x) if self.norm_first else x
        a, weights = self.attn(h, key_padding_mask=padding_mask, causal=causal, need_weights=need_weights,
                               rotary=rotary, cache=cache)
        x = x + self.dropout(a)
        if not self.norm_first:
            x = self.ln1(x)
        x = x + self.ff(self.ln2(x) if self.norm_first else x)
        if not self.norm_first:
            x = self.ln2(x)
        return x, weights  # (B, T, d_model), (B, H, T, S) | None


@dataclass
class EncoderOutput:
    hidden: Tensor  # (B, T, d_model)
    attentions: list[Tensor] | None = None  # n_layers x (B, n_heads, T, S)


class Encoder(nn.Module):
    """Token embedding, positions, n_layers blocks and a final norm (pre-LN only; post-LN blocks end normed)."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.pos == "learned":
            self.pos_emb = nn.Embedding(cfg.max_len, cfg.d_model)
        elif cfg.pos == "sinusoidal":
            self.register_buffer("pos_table", sinusoidal_table(cfg.max_len, cfg.d_model), persistent=False)
        else:
            cos, sin = rotary_tables(cfg.max_len, cfg.d_head)
            self.register_buffer("rotary_cos", cos, persistent=False)
            self.register_buffer("rotary_sin", sin, persistent=False)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model) if cfg.norm == "pre" else nn.Identity()
        self.apply(_init_weights)

    def attention_layers(self) -> list[MultiHeadAttention]:
        return [b.attn for b in self.blocks]

    def new_caches(self, batch_size: int, max_len: int | None = None, dtype: torch.dtype | None = None) -> list[KVCache]:
        """One empty KVCache per layer, for incremental decoding with `causal=True`."""
        c, p = self.cfg, self.tok_emb.weight
        return [KVCache(batch_size, c.n_kv_heads, max_len or c.max_len, c.d_head, dtype or p.dtype, p.device)
                for _ in range(c.n_layers)]

    def forward(self, input_ids: Tensor, padding_mask: Tensor | None = None, need_weights: bool = False,
                caches: list[KVCache] | None = None) -> EncoderOutput:
        """input_ids (B, T) long; padding_mask (B, T) bool, True = padding. With caches, input_ids are the
        next T tokens after what the caches hold (and padding_mask, if given, covers all cached positions)."""
        B, T = input_ids.shape
        start = caches[0].length if caches else 0
        if start + T > self.cfg.max_len:
            raise ValueError(f"sequence of {start + T} tokens exceeds model.max_len={self.cfg.max_len}")
        x = self.tok_emb(input_ids)  # (B, T, d_model)
        rotary = None
        if self.cfg.pos == "learned":
            x = x + self.pos_emb(torch.arange(start, start + T, device=input_ids.device))
        elif self.cfg.pos == "sinusoidal":
            x = x + self.pos_table[start:start + T]
        else:
            rotary = (self.rotary_cos, self.rotary_sin)
        x = self.drop(x)
        attentions = [] if need_weights else None
        for i, block in enumerate(self.blocks):
            x, w = block(x, padding_mask, self.cfg.causal, need_weights, rotary, caches[i] if caches else None)
            if need_weights:
                attentions.append(w)
        return EncoderOutput(self.ln_f(x), attentions)


def _init_weights(module: nn.Module) -> None:
    """BERT / nanoGPT initialisation: N(0, 0.02) weights, zero biases."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


@dataclass
class ModelOutput:
    logits: Tensor  # (B, n_classes) or (B, T, vocab_size)
    attentions: list[Tensor] | None = None


class SequenceClassifier(nn.Module):
    """Encoder + pooling ("cls": the first token; "mean": mean over non-padding tokens) + linear classifier."""

    def __init__(self, cfg: EncoderConfig, n_classes: int, pooling: str = "cls"):
        super().__init__()
        if pooling not in POOLINGS:
            raise ConfigError(f"model.pooling={pooling!r}: pooling must be one of {', '.join(POOLINGS)}")
        if not isinstance(n_classes, int) or n_classes < 2:
            raise ConfigError(f"n_classes={n_classes!r}: a classifier needs at least 2 classes")
        self.encoder = Encoder(cfg)
        self.pooling = pooling
        self.classifier = nn.Linear(cfg.d_model, n_classes)
        _init_weights(self.classifier)

    def attention_layers(self) -> list[MultiHeadAttention]:
        return self.encoder.attention_layers()

    def forward(self, input_ids: Tensor, padding_mask: Tensor | None = None, need_weights: bool = False) -> ModelOutput:
        out = self.encoder(input_ids, padding_mask, need_weights)
        h = out.hidden  # (B, T, d_model)
        if self.pooling == "cls":
            pooled = h[:, 0]  # (B, d_model)
        else:
            keep = torch.ones_like(h[..., 0]) if padding_mask is None else (~padding_mask).to(h.dtype)  # (B, T)
            pooled = (h * keep.unsqueeze(-1)).sum(1) / keep.sum(1, keepdim=True).clamp_min(1.0)  # (B, d_model)
        return ModelOutput(self.classifier(pooled), out.attentions)


class LanguageModel(nn.Module):
    """Encoder + token-level LM head (dense-GELU-LayerNorm transform as in BERT, then an output layer tied to the
    token embedding). Masked LM with a bidirectional encoder, next-token LM with `causal=True`."""

    def __init__(self, cfg: EncoderConfig, tie_weights: bool = True):
        super().__init__()
        self.encoder = Encoder(cfg)
        self.transform = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_model), nn.GELU(), nn.LayerNorm(cfg.d_model))
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size)
        self.transform.apply(_init_weights)
        _init_weights(self.lm_head)
        if tie_weights:
            self.lm_head.weight = self.encoder.tok_emb.weight

    def attention_layers(self) -> list[MultiHeadAttention]:
        return self.encoder.attention_layers()

    def forward(self, input_ids: Tensor, padding_mask: Tensor | None = None, need_weights: bool = False,
                caches: list[KVCache] | None = None) -> ModelOutput:
        out = self.encoder(input_ids, padding_mask, need_weights, caches)
        return ModelOutput(self.lm_head(self.transform(out.hidden)), out.attentions)  # (B, T, vocab_size)


def build_model(cfg: EncoderConfig, objective: str, n_classes: int | None = None, pooling: str = "cls",
                tie_weights: bool = True) -> SequenceClassifier | LanguageModel:
    """The model for a data objective: "classification" -> SequenceClassifier; "mlm" / "clm" -> LanguageModel."""
    if objective == "classification":
        return SequenceClassifier(cfg, n_classes, pooling)
    if objective in ("mlm", "clm"):
        return LanguageModel(cfg, tie_weights)
    raise ConfigError(f"data.objective={objective!r}: objective must be one of classification, mlm, clm")
