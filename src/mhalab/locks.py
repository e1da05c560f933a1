"""Exclusive locks on a file, one implementation for run directories (`mhalab.runs.rundir.RunLock`) and the
data cache (`mhalab.data.cache.locked`): fcntl.flock on a file opened without following links, released by the
kernel when the holder's process dies, however it dies. A holder may write its pid into the file, so a refusal
names it; `pid_alive` says whether a recorded pid still runs (the data cache's stale folders, a sweep's parent).

Not the `filelock` package: filelock 4.3.1 releases every held lock in an atexit handler, while the process is
still exiting, so a requeued SLURM job could take a run directory before its previous start has ended
(tests/runs/test_locks.py::test_a_requeued_slurm_job_waits_for_its_previous_start_to_let_go)."""

from __future__ import annotations

import fcntl
import os
import stat
import time
from pathlib import Path

from mhalab.errors import ConfigError


def open_lock_file(path: Path, what: str, flags: int = os.O_RDWR | os.O_CREAT, mode: int = 0o644) -> int:
    """The lock file itself, opened: a symbolic or hard link there (a copied run directory may hold one) would make
    the pid written into it land in another file, so either is refused in one sentence (ConfigError); `what` names
    the file ("a run directory's lock file")."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW, mode)
    except OSError as e:
        if Path(path).is_symlink():
            raise ConfigError(f"{path} is a symbolic link: {what} must be a plain file; remove the link") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        os.close(fd)
        raise ConfigError(f"{path} is not a plain file of its own (a hard link or other file): {what} must be a "
                          "plain file; remove it")
    return fd


def lock(fd: int, wait_s: float | None = 0, poll_s: float = 0.5) -> bool:
    """Take the exclusive lock on an open lock file: at once (wait_s=0), within wait_s seconds, or waiting as long
    as it takes (None). False when another process holds it still."""
    if wait_s is None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return True
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)


def write_holder(fd: int) -> None:
    """Record this process as the holder (its pid, the file's whole content)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)


def holder(fd: int) -> str:
    """The pid the holder recorded, or '?'."""
    return os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host. A zombie does not: a SIGKILLed process stays one until its parent
    reaps it (a sweep's workers, already handed to init, must not wait for that; its files are written no more)."""
    if pid <= 0:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except FileNotFoundError:
        return False
    except (OSError, IndexError):  # no /proc (macOS): whether the pid exists
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True
