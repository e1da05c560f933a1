"""Deliberate failures for the recovery tests, switched on only by the environment variable MHALAB_FAULTS (never by
the config): `MHALAB_FAULTS="kill_at_step=3,nan_at_step=5,kill_at=validation@2"`.

- kill_at_step=N: SIGKILL the process before optimizer step N (a crash mid-epoch, nothing flushed);
- nan_at_step=N: make the loss NaN at optimizer step N, through the real code path;
- kill_at=<point>[@<n>]: SIGKILL the n-th time (default the first) the code passes `point(<point>)`.

Only this module reads the variable; the training adds its callback (`mhalab.training.callbacks.FaultInjection`)
only when it is set. Unset, `point()` costs one dictionary lookup."""

from __future__ import annotations

import os
import signal

from mhalab.errors import ConfigError

ENV = "MHALAB_FAULTS"
POINTS = ("prepare", "checkpoint_write", "validation", "test", "after_summary")
KEYS = ("kill_at_step", "nan_at_step", "kill_at")
_armed: dict[str, int] = {}  # point -> passes left before the kill
_read: list[bool] = []  # whether MHALAB_FAULTS has been read (and the kill point armed) in this process


def parse(spec: str) -> tuple[str, int]:
    """'validation@2' -> ('validation', 2); 'test' -> ('test', 1). Raises ValueError naming the allowed points."""
    name, _, nth = spec.partition("@")
    if name not in POINTS or (nth and (not nth.isdigit() or int(nth) < 1)):
        raise ValueError(f"fault.kill_at={spec!r}: kill_at must be one of {', '.join(POINTS)}, optionally followed "
                         "by @<n> (the n-th pass, n >= 1)")
    return name, int(nth or 1)


def settings() -> dict | None:
    """MHALAB_FAULTS as {kill_at_step, nan_at_step, kill_at}, None when unset or empty; a bad entry is one
    ConfigError sentence naming the variable, the key and the allowed values."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return None
    out: dict = {}
    for item in text.split(","):
        key, sep, value = (part.strip() for part in item.partition("="))
        if key not in KEYS or not sep:
            raise ConfigError(f"{ENV}={text!r}: {item.strip()!r} is not key=value with a key among {', '.join(KEYS)}")
        if key == "kill_at":
            try:
                parse(value)
            except ValueError as e:
                raise ConfigError(f"{ENV}: {e}") from None
            out[key] = value
        elif not value.isdigit():
            raise ConfigError(f"{ENV}: fault.{key}={value!r}: {key} must be an integer >= 0 (an optimizer step)")
        else:
            out[key] = int(value)
    return out


def point(name: str) -> None:
    """A place a crash is tested at: SIGKILL here when MHALAB_FAULTS arms it and this is the n-th pass."""
    if not _read:
        _read.append(True)
        spec = (settings() or {}).get("kill_at")
        if spec:
            point_name, nth = parse(spec)
            _armed[point_name] = nth
    if name in _armed:
        _armed[name] -= 1
        if _armed[name] == 0:
            os.kill(os.getpid(), signal.SIGKILL)
