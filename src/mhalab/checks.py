"""Value checks shared by every config node: each failure is a ConfigError naming the key and what is allowed."""

from __future__ import annotations

import math
import os
from typing import Any, Iterator

from mhalab.errors import ConfigError

INT64_MAX = 2**63 - 1  # every count is at most this (torch, Lightning and numpy hold them in int64)
NAME_MAX = 255  # bytes in one file or folder name (Linux and macOS)
PATH_MAX = 4096  # bytes in a whole path (Linux)


def check_int(key: str, value: Any, low: int | None = None, high: int | None = None) -> int:
    """value must be an int (not a bool) in [low, high], and within int64 whatever the bounds."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key}={value!r}: {_name(key)} must be an integer{_range(low, high)}")
    lo = max(low, -INT64_MAX) if low is not None else -INT64_MAX
    hi = min(high, INT64_MAX) if high is not None else INT64_MAX
    if not lo <= value <= hi:
        shown_low = low if low is not None or value >= -INT64_MAX else "-(2**63 - 1)"
        shown_high = high if high is not None or value <= INT64_MAX else "2**63 - 1"
        raise ConfigError(f"{key}={value!r}: {_name(key)} must be an integer{_range(shown_low, shown_high)}")
    return value


def available_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (all of the machine's where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def check_name(key: str, value: Any) -> str:
    """value becomes one file or folder name: 1 to NAME_MAX bytes of text, without '/' or NUL, not '.' or '..'."""
    text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    if text is None or text in ("", ".", "..") or "/" in text or "\0" in text or len(text.encode()) > NAME_MAX:
        size = f" (it has {len(text.encode())} bytes)" if text is not None and len(text.encode()) > NAME_MAX else ""
        raise ConfigError(f"{key}={_short(value)}: {_name(key)} becomes a file or folder name, so it must be 1 to "
                          f"{NAME_MAX} bytes without '/' or NUL{size}")
    return text


def check_path(key: str, value: Any) -> str:
    """value is a path: no NUL, each of its names at most NAME_MAX bytes, the whole at most PATH_MAX bytes."""
    text = os.fspath(value)
    long = [part for part in text.split("/") if len(part.encode()) > NAME_MAX]
    if "\0" in text or long or len(text.encode()) > PATH_MAX:
        what = (f"its part {_short(long[0])} has {len(long[0].encode())} bytes" if long else
                "it has a NUL character" if "\0" in text else f"it has {len(text.encode())} bytes")
        raise ConfigError(f"{key}={_short(text)}: a path may not contain NUL, each file or folder name in it may have "
                          f"at most {NAME_MAX} bytes and the whole at most {PATH_MAX}; {what}")
    return text


def _short(value: Any) -> str:
    """repr of a value, cut to 60 characters (a 300-byte name fills no screen)."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}...{text[-12:]} ({len(str(value))} characters)"


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
