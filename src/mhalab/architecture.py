"""The architecture of a model, without torch: the attention layer's and the encoder's settings, each checked, and
`Architecture`, the resolved model a run trains, a checkpoint holds and `summary.json` records.

`mhalab.model.build_model(arch)` builds it, `mhalab.cost` prices it, `mhalab.config.schema` puts its settings
into a run's config. Every error is a `ConfigError`: one sentence naming the key and the allowed values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from mhalab.checks import check_choice, check_int, check_number
from mhalab.cost import attention_params
from mhalab.errors import ConfigError
from mhalab.heads import resolve_heads

BACKENDS = ("sdpa", "math")
NORMS = ("pre", "post")
POSITIONS = ("learned", "sinusoidal", "rotary")
POOLINGS = ("cls", "mean")
OBJECTIVES = ("classification", "mlm", "clm")
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")  # torch.compile backends: inductor generates kernels (a C++
#   compiler on the CPU); aot_eager and eager trace only (for checking that the model compiles, not for speed)


# -- model -----------------------------------------------------------------------------------------------------

@dataclass
class AttentionConfig:
    """The attention layer (`mhalab.attention.MultiHeadAttention`)."""

    n_heads: int = 4
    n_kv_heads: Optional[int] = None  # None = n_heads (MHA); 1 = MQA; a divisor of n_heads = GQA
    d_head: Optional[int] = None  # None = model.d_model // n_heads; any positive value decouples width from count
    backend: str = "sdpa"  # sdpa (torch scaled_dot_product_attention) | math (explicit softmax)
    dropout: float = 0.0  # on the attention weights

    def __post_init__(self):
        check_int("attention.n_heads", self.n_heads, 1)
        if self.n_kv_heads is not None:
            check_int("attention.n_kv_heads", self.n_kv_heads, 1)
        if self.d_head is not None:
            check_int("attention.d_head", self.d_head, 1)
        check_choice("attention.backend", self.backend, BACKENDS)
        check_number("attention.dropout", self.dropout, 0, 1, high_open=True)


@dataclass
class ParamMatch:
    """A reference attention layer whose parameter count an arm should have (Shazeer 2019 raised d_ff for MQA)."""

    n_heads: int = 4
    n_kv_heads: Optional[int] = None
    d_head: Optional[int] = None


@dataclass
class ModelConfig:
    """The encoder around the attention layer (`mhalab.model`)."""

    d_model: int = 128
    n_layers: int = 2
    d_ff: int = 512
    dropout: float = 0.1  # embeddings, residual branches, feed-forward
    norm: str = "pre"  # pre (pre-LN) | post (post-LN, Vaswani et al. 2017)
    pos: str = "learned"  # learned | sinusoidal | rotary
    rope_base: float = 10000.0  # rotary only: the base of the rotation frequencies
    rotary_dim: Optional[int] = None  # rotary only: rotated features per head (even, <= d_head); None = all of d_head
    short_conv: int = 0  # width of a causal depthwise convolution over the embeddings (0 = none); Zoology's attention
    #                      baselines use 3 so the previous token is at hand and attention only has to recall
    max_len: int = 512  # size of the positional table; must be >= data.max_len
    bias: bool = True
    pooling: str = "mean"  # classification: mean (over non-padding tokens) | cls (the first token)
    tie_weights: bool = True  # the LM head shares the token embedding
    param_match: Optional[ParamMatch] = None  # set d_ff so the model has the parameters it has with this attention
    compile: bool = False  # torch.compile the training forward pass (validation, statistics and importance stay
    #   eager). How the model is run, not what it is: Architecture.to_dict() leaves it out (checkpoints, the
    #   summary's architecture, report arms); the summary's config records it.
    compile_backend: str = "inductor"  # with compile: inductor | aot_eager | eager (see COMPILE_BACKENDS)

    def __post_init__(self):
        if not isinstance(self.compile, bool):
            raise ConfigError(f"model.compile={self.compile!r}: compile must be true or false")
        check_choice("model.compile_backend", self.compile_backend, COMPILE_BACKENDS)
        for key in ("d_model", "n_layers", "d_ff", "max_len"):
            check_int(f"model.{key}", getattr(self, key), 1, 1 << 20)
        for key in ("dropout",):
            check_number(f"model.{key}", getattr(self, key), 0, 1, high_open=True)
        check_choice("model.norm", self.norm, NORMS)
        check_choice("model.pos", self.pos, POSITIONS)
        check_choice("model.pooling", self.pooling, POOLINGS)
        check_number("model.rope_base", self.rope_base, 1, low_open=True)
        if self.rotary_dim is not None:
            check_int("model.rotary_dim", self.rotary_dim, 2)
        check_int("model.short_conv", self.short_conv, 0, 64)


RUN_ONLY_MODEL_KEYS = ("compile", "compile_backend")  # model keys that say how a model is run, not what it is


@dataclass
class Architecture:
    """The resolved model a run trains and a checkpoint holds: attention sizes filled in, d_ff matched,
    vocabulary and classes from the data. `build_model(arch)` builds it; `mhalab.cost` prices it."""

    vocab_size: int
    objective: str = "classification"  # classification | mlm | clm
    n_classes: Optional[int] = None  # classification only
    model: ModelConfig = field(default_factory=ModelConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)

    def __post_init__(self):
        if isinstance(self.model, dict):
            self.model = ModelConfig(**{k: v for k, v in self.model.items() if k != "param_match"},
                                     param_match=_param_match(self.model.get("param_match")))
        if isinstance(self.attention, dict):
            self.attention = AttentionConfig(**self.attention)
        check_int("vocab_size", self.vocab_size, 2, 1 << 24)
        check_choice("data.objective", self.objective, OBJECTIVES)
        if self.objective == "classification":
            check_int("n_classes", self.n_classes, 2, 1 << 20)
        m, a = self.model, self.attention
        a.n_kv_heads, a.d_head = resolve_heads(m.d_model, a.n_heads, a.n_kv_heads, a.d_head, "attention.")
        if m.param_match is not None:
            m.d_ff, m.param_match = matched_d_ff(m, a, m.param_match), None
        if m.pos == "rotary":
            rotary_dim = a.d_head if m.rotary_dim is None else m.rotary_dim
            if rotary_dim % 2 or rotary_dim > a.d_head:
                raise ConfigError(f"model.rotary_dim={rotary_dim} with attention.d_head={a.d_head}: rotary positions "
                                  "rotate an even number of features, at most d_head")

    @property
    def causal(self) -> bool:
        """True for next-token objectives: each position sees only itself and the past."""
        return self.objective == "clm"

    def to_dict(self) -> dict:
        """The architecture as plain data; how the model is run (model.compile, model.compile_backend) is left out."""
        d = dataclasses.asdict(self)
        for key in RUN_ONLY_MODEL_KEYS:
            d["model"].pop(key, None)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Architecture:
        """From `to_dict()` output (a checkpoint's hyperparameters, a summary); unknown keys are an error."""
        if not isinstance(d, dict):
            raise ConfigError(f"an architecture must be a mapping, got {type(d).__name__}")
        _known_keys("architecture", d, cls)
        _known_keys("model", d.get("model") or {}, ModelConfig)
        _known_keys("attention", d.get("attention") or {}, AttentionConfig)
        return cls(**d)


def _param_match(node) -> ParamMatch | None:
    return ParamMatch(**node) if isinstance(node, dict) else node


def _known_keys(where: str, d: dict, cls) -> None:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ConfigError(f"unknown {where} key {unknown[0]!r}: allowed keys are {', '.join(sorted(known))}")


def matched_d_ff(model: ModelConfig, attention: AttentionConfig, ref: ParamMatch) -> int:
    """The d_ff that gives `model` with `attention` the parameter count it has with `ref` attention and its own
    d_ff, as nearly as an integer allows (one feed-forward unit holds 2 * d_model + 1 parameters with bias)."""

    ref_kv, ref_d_head = resolve_heads(model.d_model, ref.n_heads, ref.n_kv_heads, ref.d_head, "model.param_match.")
    delta = (attention_params(model.d_model, ref.n_heads, ref_d_head, ref_kv, model.bias)
             - attention_params(model.d_model, attention.n_heads, attention.d_head, attention.n_kv_heads, model.bias))
    d_ff = model.d_ff + round(delta / (2 * model.d_model + int(model.bias)))
    if d_ff < 1:
        raise ConfigError(f"model.param_match: matching {ref} needs d_ff={d_ff}; raise model.d_ff")
    return d_ff
