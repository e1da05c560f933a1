"""Early validation of a composed training config: one sentence naming the bad key, before anything runs.

Hydra already refuses overrides of keys that do not exist; this catches wrong types and values, unknown keys
added to the groups, and combinations (n_kv_heads must divide n_heads, data.max_len <= model.max_len, ...).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from mhalab.errors import ConfigError
from mhalab.model import EncoderConfig

ATTENTION_KEYS = {"n_heads", "n_kv_heads", "d_head", "backend", "dropout"}
MODEL_KEYS = {"d_model", "n_layers", "d_ff", "dropout", "norm", "pos", "max_len", "bias", "pooling", "tie_weights"}
OPTIM_KEYS = {"lr", "weight_decay", "betas", "eps", "warmup_steps", "warmup_ratio", "min_lr_ratio"}
STATS_KEYS = {"enabled", "every_n_steps", "probe_size", "importance", "importance_batches", "plots", "max_plot_tokens"}
# Where `_target_` may point: the project's own classes, Lightning's and torch's. Nothing else is instantiated.
SAFE_TARGET_PREFIXES = ("mhalab.", "lightning.pytorch.", "torch.")


def _check_keys(node: Any, group: str, allowed: set[str]) -> dict:
    if not isinstance(node, (dict, DictConfig)):
        raise ConfigError(f"{group} must be a mapping of keys ({', '.join(sorted(allowed))}), got {node!r}")
    d = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise ConfigError(f"unknown key {group}.{unknown[0]}: allowed keys in {group} are {', '.join(sorted(allowed))}")
    return d


def _number(group: str, d: dict, key: str, kind: type, low: float | None = None, high: float | None = None,
            low_inclusive: bool = True, optional: bool = False) -> None:
    value = d.get(key)
    if value is None and optional:
        return
    ok_type = isinstance(value, kind) and not isinstance(value, bool)
    if kind is float:
        ok_type = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok_type:
        raise ConfigError(f"{group}.{key}={value!r}: {key} must be {'an integer' if kind is int else 'a number'}")
    if low is not None and (value < low or (value == low and not low_inclusive)):
        bound = f">= {low}" if low_inclusive else f"> {low}"
        raise ConfigError(f"{group}.{key}={value!r}: {key} must be {bound}")
    if high is not None and value >= high:
        raise ConfigError(f"{group}.{key}={value!r}: {key} must be < {high}")


def encoder_config(cfg: DictConfig, vocab_size: int, causal: bool = False) -> EncoderConfig:
    """The model's EncoderConfig from the `model` and `attention` groups (validated)."""
    a = _check_keys(cfg.attention, "attention", ATTENTION_KEYS)
    m = _check_keys(cfg.model, "model", MODEL_KEYS)
    _number("attention", a, "n_heads", int, 1)
    _number("attention", a, "n_kv_heads", int, 1, optional=True)
    _number("attention", a, "d_head", int, 1, optional=True)
    _number("attention", a, "dropout", float, 0, 1)
    for key in ("d_model", "n_layers", "d_ff", "max_len"):
        _number("model", m, key, int, 1)
    _number("model", m, "dropout", float, 0, 1)
    if a.get("n_kv_heads") is not None and a["n_heads"] % a["n_kv_heads"]:
        raise ConfigError(f"attention.n_kv_heads={a['n_kv_heads']} with attention.n_heads={a['n_heads']}: "
                          "n_kv_heads must divide n_heads")
    if a.get("d_head") is None and m["d_model"] % a["n_heads"]:
        raise ConfigError(f"attention.d_head=null with model.d_model={m['d_model']} and attention.n_heads="
                          f"{a['n_heads']}: d_model must be divisible by n_heads, or set attention.d_head")
    if m.get("pooling", "cls") not in ("cls", "mean"):
        raise ConfigError(f"model.pooling={m['pooling']!r}: pooling must be one of cls, mean")
    return EncoderConfig(vocab_size=vocab_size, max_len=m["max_len"], d_model=m["d_model"], n_layers=m["n_layers"],
                         n_heads=a["n_heads"], n_kv_heads=a.get("n_kv_heads"), d_head=a.get("d_head"), d_ff=m["d_ff"],
                         dropout=m["dropout"], attn_dropout=a.get("dropout", 0.0), norm=m.get("norm", "pre"),
                         pos=m.get("pos", "learned"), backend=a.get("backend", "sdpa"), bias=m.get("bias", True),
                         causal=causal)


def validate(cfg: DictConfig) -> None:
    """Check a composed training config before any data is read or any file is written.

    Raises ConfigError with one sentence naming the key and what is allowed.
    """
    for key in ("data", "model", "attention", "optim", "trainer"):
        if key not in cfg or cfg[key] is None:
            raise ConfigError(f"the config has no `{key}` group: compose one, e.g. {key}=<name>")
    _number("", {"seed": cfg.get("seed")}, "seed", int, 0)
    encoder_config(cfg, vocab_size=1)  # sizes, types, n_kv_heads | n_heads, d_head / d_model
    data_len = cfg.data.get("max_len")
    if isinstance(data_len, int) and data_len > cfg.model.max_len:
        raise ConfigError(f"data.max_len={data_len} is longer than the positional table model.max_len="
                          f"{cfg.model.max_len}: raise model.max_len or lower data.max_len")
    o = _check_keys(cfg.optim, "optim", OPTIM_KEYS)
    _number("optim", o, "lr", float, 0, low_inclusive=False)
    _number("optim", o, "weight_decay", float, 0)
    _number("optim", o, "warmup_steps", int, 0)
    _number("optim", o, "warmup_ratio", float, 0, 1, optional=True)
    _number("optim", o, "min_lr_ratio", float, 0, 1.0000001)
    if cfg.get("stats") is not None:
        s = _check_keys(cfg.stats, "stats", STATS_KEYS)
        for key in ("every_n_steps", "probe_size", "importance_batches"):
            _number("stats", s, key, int, 1)
    fault = cfg.get("fault") or {}
    for key in fault:
        _number("fault", fault, key, int, 0, optional=True)
    for group in ("logger", "callbacks"):
        for name, node in (cfg.get(group) or {}).items():
            check_target(node, f"{group}.{name}")


def check_target(node: Any, where: str) -> None:
    """Refuse a `_target_` outside the project's own, Lightning's and torch's classes."""
    if isinstance(node, (dict, DictConfig)) and "_target_" in node:
        target = str(node["_target_"])
        if not target.startswith(SAFE_TARGET_PREFIXES):
            raise ConfigError(f"{where}._target_={target!r}: only classes under "
                              f"{', '.join(p.rstrip('.') for p in SAFE_TARGET_PREFIXES)} may be instantiated")


def instantiate_safe(node: DictConfig, where: str) -> Any:
    """hydra.utils.instantiate, after check_target on the node."""
    import hydra

    check_target(node, where)
    return hydra.utils.instantiate(node)
