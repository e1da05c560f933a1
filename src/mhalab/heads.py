"""The head layout, one rule in one place: how many heads, how wide, which KV head each query head reads, and
how a head is named. Used by the layer, the config schema, statistics, conversion and reports."""

from __future__ import annotations

from mhalab.checks import check_int
from mhalab.errors import ConfigError


def resolve_heads(d_model: int, n_heads: int, n_kv_heads: int | None = None, d_head: int | None = None,
                  prefix: str = "") -> tuple[int, int]:
    """(n_kv_heads, d_head) with their defaults filled: n_kv_heads None = n_heads (MHA), d_head None =
    d_model // n_heads. n_kv_heads must divide n_heads (query head i reads KV head `kv_head_of(i, ...)`).

    `prefix` names the keys in errors: "attention." for a config, "" for the layer's arguments.
    """
    check_int(f"{prefix}n_heads", n_heads, 1)
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    check_int(f"{prefix}n_kv_heads", n_kv_heads, 1)
    if n_heads % n_kv_heads:
        divisors = [g for g in range(1, n_heads + 1) if n_heads % g == 0]
        raise ConfigError(f"{prefix}n_kv_heads={n_kv_heads} with {prefix}n_heads={n_heads}: n_kv_heads must divide "
                          f"n_heads (one of {', '.join(map(str, divisors))})")
    if d_head is None:
        if d_model % n_heads:
            raise ConfigError(f"{prefix}d_head=None with d_model={d_model} and {prefix}n_heads={n_heads}: d_model "
                              f"must be divisible by n_heads, or set {prefix}d_head")
        d_head = d_model // n_heads
    check_int(f"{prefix}d_head", d_head, 1)
    return n_kv_heads, d_head


def kv_head_of(head: int, n_heads: int, n_kv_heads: int) -> int:
    """The KV head that query head `head` reads: contiguous groups of n_heads // n_kv_heads query heads."""
    return head // (n_heads // n_kv_heads)


def head_label(layer: int, head: int) -> str:
    """TransformerLens' label of a head: L{layer}H{head}."""
    return f"L{layer}H{head}"
