"""Value checks shared by every config node: each failure is a ConfigError naming the key and what is allowed."""

from __future__ import annotations

import math
from typing import Any, Iterator

from mhalab.errors import ConfigError


def check_int(key: str, value: Any, low: int | None = None, high: int | None = None) -> int:
    """value must be an int (not a bool) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key}={value!r}: {_name(key)} must be an integer{_range(low, high)}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ConfigError(f"{key}={value!r}: {_name(key)} must be an integer{_range(low, high)}")
    return value


def check_number(key: str, value: Any, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False) -> float:
    """value must be a finite real number in the interval given by low/high (open where *_open)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{key}={value!r}: {_name(key)} must be a finite number"
                          f"{_interval(low, high, low_open, high_open)}")
    bad_low = low is not None and (value < low or (low_open and value == low))
    bad_high = high is not None and (value > high or (high_open and value == high))
    if bad_low or bad_high:
        raise ConfigError(f"{key}={value!r}: {_name(key)} must be a number{_interval(low, high, low_open, high_open)}")
    return float(value)


def check_finite(key: str, value: Any) -> Any:
    """Every float a config gives is finite (inf and nan pass comparisons silently): one sentence otherwise."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}={value!r}: {_name(key)} must be a finite number")
    if isinstance(value, dict):
        for k, v in value.items():
            check_finite(f"{key}.{k}" if key else str(k), v)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_finite(f"{key}[{i}]", v)
    return value


def check_choice(key: str, value: Any, allowed: tuple) -> Any:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r}: {_name(key)} must be one of {', '.join(map(str, allowed))}")
    return value


def unknown_key(key: str, keys, addable: bool = False) -> ConfigError:
    """The sentence for a key that does not exist (`key` dotted, `keys` those of its parent), with the closest
    existing key as a guess: "attention.n_head is not a key of attention; did you mean n_heads? keys of ...";
    `addable`: a node of free keys (not a schema's), where Hydra's `+key=value` adds one."""
    import difflib

    parent, _, name = key.rpartition(".")
    keys = [str(k) for k in keys]
    where = parent or "the config"
    guess = difflib.get_close_matches(name, keys, n=1, cutoff=0.6)
    hint = f"; did you mean {guess[0]}?" if guess else ";"
    source = f"; +{key}=VALUE adds it as a new key" if addable else " (mhalab/config/schema.py)"
    return ConfigError(f"{key} is not a key of {where}{hint} keys of {where} are {', '.join(keys)}{source}")


def _range(low, high) -> str:
    if low is not None and high is not None:
        return f" in [{low}, {high}]"
    return f" >= {low}" if low is not None else (f" <= {high}" if high is not None else "")


def _interval(low, high, low_open, high_open) -> str:
    if low is None and high is None:
        return ""
    if high is None:
        return f" {'>' if low_open else '>='} {low}"
    if low is None:
        return f" {'<' if high_open else '<='} {high}"
    return f" in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"


def _name(key: str) -> str:
    """The last part of a dotted key: `attention.n_heads` -> `n_heads`."""
    return key.rsplit(".", 1)[-1]


def walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every node of plain config data, dicts and lists included, parents first."""
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk(value, f"{path}[{i}]")
