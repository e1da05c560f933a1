"""Named crash points for the recovery tests: `fault.kill_at=<point>[@<n>]` SIGKILLs the process the n-th time
(default the first) the code passes `point(<point>)`. Unarmed, `point()` costs one comparison."""

from __future__ import annotations

import os
import signal

POINTS = ("prepare", "checkpoint_write", "validation", "test", "after_summary")
_armed: dict[str, int] = {}  # point -> passes left before the kill


def parse(spec: str) -> tuple[str, int]:
    """'validation@2' -> ('validation', 2); 'test' -> ('test', 1). Raises ValueError naming the allowed points."""
    name, _, nth = spec.partition("@")
    if name not in POINTS or (nth and (not nth.isdigit() or int(nth) < 1)):
        raise ValueError(f"fault.kill_at={spec!r}: kill_at must be one of {', '.join(POINTS)}, optionally followed "
                         "by @<n> (the n-th pass, n >= 1)")
    return name, int(nth or 1)


def arm(spec: str | None) -> None:
    """Arm one kill point for this process (None disarms)."""
    _armed.clear()
    if spec:
        name, nth = parse(spec)
        _armed[name] = nth


def point(name: str) -> None:
    """A place a crash is tested at: SIGKILL here when armed and this is the n-th pass."""
    if name in _armed:
        _armed[name] -= 1
        if _armed[name] == 0:
            os.kill(os.getpid(), signal.SIGKILL)
