"""A run directory's lock and housekeeping: one process works in a run directory at a time (RunLock, on
`mhalab.locks`), and what an interrupted write left there is removed."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from mhalab.errors import ConfigError
from mhalab.runs.summary import SUMMARY

LAST = Path("checkpoints") / "last.ckpt"
LOCK = ".lock"
REQUEUE_WAIT_S = 180  # how long a requeued SLURM job waits for its previous start to let go of the run


class RunLock:
    """An exclusive lock on a run directory (<run_dir>/.lock, `mhalab.locks`), held while a process works in it and
    released by the kernel when the process dies, however it dies."""

    WHAT = "a run directory's lock file"

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK
        self.fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or ConfigError naming its holder. A requeued SLURM job waits up to REQUEUE_WAIT_S for it:
        SLURM may start the job again while its previous start is still saving and exiting."""
        from mhalab.locks import lock, write_holder
        from mhalab.runs.slurm import requeued

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = self._open(os.O_RDWR | os.O_CREAT)
        if not lock(fd, REQUEUE_WAIT_S if requeued() else 0):
            self._refuse(fd)
        write_holder(fd)
        self.fd = fd

    def _open(self, flags: int) -> int:
        from mhalab.locks import open_lock_file

        try:
            return open_lock_file(self.path, self.WHAT, flags)
        except OSError as e:
            raise ConfigError(f"{self.path} cannot be opened ({e.strerror})") from None

    def _refuse(self, fd: int) -> None:
        from mhalab.locks import holder

        who = holder(fd)
        os.close(fd)
        raise ConfigError(f"{self.path.parent} is in use by another process (pid {who}); wait for it or stop it "
                          "before running there")

    def check(self) -> None:
        """ConfigError naming the holder if another process holds the lock; writes nothing."""
        from mhalab.locks import lock

        fd = self._open(os.O_RDONLY)
        if not lock(fd):
            self._refuse(fd)
        os.close(fd)

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def launcher_rank() -> int:
    """This process's rank when a launcher (Lightning's DDP, torchrun, SLURM tasks) started several; else 0."""
    return int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")) or 0)


def check_unlocked(run_dir: Path) -> None:
    """ConfigError if another process holds the run directory's lock (DDP's other ranks work in rank 0's run
    directory, under its lock)."""
    if launcher_rank() > 0:
        return
    lock = RunLock(run_dir)
    if lock.path.exists() or lock.path.is_symlink():
        lock.check()


def remove_stale_temporaries(run_dir: Path) -> list[Path]:
    """Temporary files an interrupted write left in a run directory (checkpoints, summary): removed, returned."""
    stale = [p for pattern in (".*.ckpt.*.tmp", f".{SUMMARY}.*.tmp", "checkpoints/.*.tmp")
             for p in Path(run_dir).glob(pattern) if p.is_file()]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale
