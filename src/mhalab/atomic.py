"""One way to replace a file so that a reader, or a kill at any moment, finds the old file or the new one, never
half of one: the bytes go to a temporary `.<name>.<pid>.<random>.tmp` beside it, are fsynced, then `os.replace`d
onto it (`mhalab.runs.rundir.remove_stale_temporaries` removes what a killed writer left)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Callable


def write_atomic(path: str | os.PathLike, data: bytes | str, mode: int = 0o666,
                 before_replace: Callable[[], None] | None = None) -> Path:
    """Replace `path` with `data` atomically; `mode` before the umask; `before_replace` runs once the bytes are on
    disk (the recovery tests kill there). An OSError names `path` and leaves no temporary file behind."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(path)) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
