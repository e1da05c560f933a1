"""A folder cache that cannot lie: content-derived keys, a checked manifest, locked atomic writes.

A cache folder is written complete inside ``<folder>.tmp-<pid>/`` and renamed into place while holding
the lock file ``<folder>.lock``; such temporary folders of dead processes are removed.  Its
``manifest.json`` holds the full key and the size and sha256 of every file written; ``ensure`` checks
all of them on every use.  A damaged folder (a file missing, cut short or
changed, an unreadable manifest) is logged in one line and rebuilt.  Files added later (e.g. ``datasets``'
own ``cache-*.arrow`` files from a ``map``) are not part of the cache and are ignored.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from mhalab import faults
from mhalab.locks import lock, open_lock_file, pid_alive

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
ABSENT = "absent"  # ``problem``'s answer for a folder that was never written (not damage)
TMP_NAME = re.compile(r"^(?P<name>.+)\.tmp-(?P<pid>\d+)$")
ADVICE = "free space or set paths.cache_dir to a writable directory with room"

T = TypeVar("T")


class CacheWriteError(OSError):
    """Writing a cache folder failed; ``filename`` names the file or folder, the message says what to do."""


# -- keys ------------------------------------------------------------------------------------------------
def canonical(parts: Any) -> str:
    """``parts`` as canonical JSON (sorted keys); raises TypeError for values JSON cannot hold."""
    return json.dumps(parts, sort_keys=True, separators=(",", ":"), allow_nan=False)


def key(parts: Any) -> str:
    """The full sha256 (hex) of ``parts``: everything the cached content depends on."""
    return hashlib.sha256(canonical(parts).encode()).hexdigest()


def file_digest(path: str | os.PathLike) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def tree_digest(root: Path) -> str:
    """One sha256 over the relative path and content of every file under ``root``."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(f"{path.relative_to(root).as_posix()}\0{file_digest(path)}\n".encode())
    return h.hexdigest()


# -- manifest --------------------------------------------------------------------------------------------
def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(folder: Path, parts: Any) -> None:
    """Record the key and the size and sha256 of every file now in ``folder``."""
    files = {rel: {"size": (folder / rel).stat().st_size, "sha256": file_digest(folder / rel)}
             for rel in _files(folder)}
    manifest = {"key": key(parts), "made_from": parts, "files": files}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))


def problem(folder: Path, parts: Any, required: Iterable[str] = ()) -> str | None:
    """None if ``folder`` holds an intact cache made from ``parts``; ``ABSENT`` if there is none; else what is wrong."""
    if not folder.exists():
        return ABSENT
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        want, files = manifest["key"], manifest["files"]
        sizes = {rel: int(entry["size"]) for rel, entry in files.items()}
        digests = {rel: str(entry["sha256"]) for rel, entry in files.items()}
    except FileNotFoundError:
        return f"{MANIFEST} is missing"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"{MANIFEST} is unreadable ({type(e).__name__})"
    if want != key(parts):
        return f"{MANIFEST} belongs to other settings"
    for rel in required:
        if rel not in files:
            return f"{MANIFEST} does not list {rel}"
    for rel, size in sizes.items():  # sizes first: cheap, and they catch cut-short files
        path = folder / rel
        if not path.is_file():
            return f"{_missing_part(folder, rel)} is missing"
        if path.stat().st_size != size:
            return f"{rel} has {path.stat().st_size} bytes instead of {size}"
    for rel, digest in digests.items():
        try:
            if file_digest(folder / rel) != digest:
                return f"{rel} does not match its sha256"
        except OSError as e:
            return f"{rel} cannot be read ({e.strerror or e})"
    return None


def _missing_part(folder: Path, rel: str) -> str:
    """The outermost missing piece of ``rel``: ``dataset/`` when the whole folder is gone."""
    parts = Path(rel).parts
    for i in range(1, len(parts)):
        if not (folder / Path(*parts[:i])).is_dir():
            return "/".join(parts[:i]) + "/"
    return rel


# -- building --------------------------------------------------------------------------------------------
def ensure(
    folder: Path,
    parts: Any,
    build: Callable[[Path], T],
    save: Callable[[T, Path], None],
    required: Iterable[str] = (),
) -> Path:
    """Return ``folder`` once it holds an intact cache made from ``parts``.

    If it is absent or damaged, it is written anew under its lock (unless another process did so while we
    waited): ``build(scratch)`` makes the content, using ``scratch`` for any files it needs on the way, and
    ``save(content, out)`` writes it.  Both live in ``<folder>.tmp-<pid>/``, which is removed whatever
    happens.  An OSError while writing raises ``CacheWriteError``; ``build``'s own errors pass unchanged.
    """
    required = list(required)
    remove_stale(folder.parent)
    if problem(folder, parts, required) is None:
        return folder
    with locked(folder):
        reason = problem(folder, parts, required)
        if reason is None:  # another process wrote it while we waited
            return folder
        if reason != ABSENT:
            log.warning("data cache %s is damaged (%s); rebuilding it", folder, reason)
        else:
            log.info("preparing the data into %s (once: later runs reuse it)", folder)
        work = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
        out = work / "out"
        try:
            with _writing(work):
                _remove(work)
                (work / "scratch").mkdir(parents=True)
            content = build(work / "scratch")
            with _writing(out):
                out.mkdir()
                save(content, out)
                faults.point("prepare")  # the recovery tests kill here: half a cache written
                write_manifest(out, parts)
                _remove(folder)
                os.rename(out, folder)
        finally:
            shutil.rmtree(work, ignore_errors=True)  # nothing half-written stays behind
    return folder


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


@contextlib.contextmanager
def _writing(where: Path) -> Iterator[None]:
    """Re-raise an OSError as ``CacheWriteError`` naming the file (or ``where``) and the way out."""
    try:
        yield
    except CacheWriteError:
        raise
    except OSError as e:
        reason = e.strerror or str(e) or type(e).__name__
        raise CacheWriteError(
            e.errno, f"{reason} (writing the tokenized-data cache; {ADVICE})", e.filename or str(where)
        ) from e


@contextlib.contextmanager
def locked(folder: Path, blocking: bool = True) -> Iterator[bool]:
    """Hold ``<folder>.lock`` (`mhalab.locks`, as a run directory's lock) for the duration; yields False if not
    ``blocking`` and it is taken."""
    path = folder.with_name(f"{folder.name}.lock")
    with _writing(path):
        folder.parent.mkdir(parents=True, exist_ok=True)
        fd = open_lock_file(path, "a data cache's lock file", mode=0o666)
    try:
        yield lock(fd, None if blocking else 0)
    finally:
        os.close(fd)  # releases the lock


def remove_stale(parent: Path) -> None:
    """Remove ``<folder>.tmp-<pid>`` folders of processes that died while writing.

    A folder is kept while its pid is alive on this host or while its ``<folder>.lock`` is held (a
    writer on another host sharing the file system).  Best effort: failures are ignored.
    """
    if not parent.is_dir():
        return
    for tmp in parent.glob("*.tmp-*"):
        match = TMP_NAME.match(tmp.name)
        if match is None or pid_alive(int(match["pid"])):
            continue
        try:
            with locked(parent / match["name"], blocking=False) as held:
                if held:
                    shutil.rmtree(tmp, ignore_errors=True)
        except OSError:
            pass

