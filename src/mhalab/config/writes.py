"""Where a config may make a run write: under its run directory, `paths.log_dir` or the cache, nowhere else.

`check_writes(plain, run_dir)` takes the job's config resolved as the job will see it (`mhalab.config.compose.resolved`)
and checks every path-valued key of the nodes that write files: loggers and callbacks (`save_dir`, `dir`, ...),
Python logging handlers (`filename`), the launchers' folders (`submitit_folder`, `temp_folder`), the Optuna
sweeper's `storage` (a sqlite file) and Hydra's `output_subdir`. Symbolic links and `..` are resolved first.
A logger's folder is checked as the logger makes it (`save_dir` joined with `name`, `version`, `sub_dir`), and a log
file's name must end in `.log`: a config chooses its lines (the formatter's `format`), so a log file named
`.bashrc` or `x.pth` in a folder the config points at would be a script. Every such path fits the file system
(`mhalab.checks.check_path`), and a logger's `name`, `version` and `id` are single names (`check_name`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mhalab.checks import check_name, check_path, walk
from mhalab.errors import ConfigError

PATH_KEYS = ("save_dir", "dir", "dirpath", "root_dir", "log_dir", "filename", "submitit_folder", "temp_folder",
             "default_root_dir", "output_dir", "path")
URL_KEYS = ("storage", "tracking_uri")
LOGGING_SECTIONS = ("hydra.job_logging", "hydra.hydra_logging")
LOG_SUFFIX = ".log"
SUBDIR_KEYS = ("name", "version", "sub_dir")  # joined to save_dir by Lightning's CSV and TensorBoard loggers
SECTIONS = ("logger", "callbacks", "hydra.callbacks", "hydra.job_logging", "hydra.hydra_logging", "hydra.launcher",
            "hydra.sweeper")


def check_writes(plain: dict, run_dir: str | Path) -> None:
    """ConfigError naming the first key that would write outside the run directory, paths.log_dir or the cache."""
    hydra = plain.get("hydra") or {}
    base = Path(run_dir) if (hydra.get("job") or {}).get("chdir") else Path.cwd()
    for key in ("paths.log_dir", "paths.cache_dir", "data.cache_dir", "data.hf_cache_dir"):
        node, name = key.split(".")
        if (plain.get(node) or {}).get(name):
            check_path(key, plain[node][name])
    roots = [_real(Path(run_dir), base)] + [_real(Path(p), base) for p in (
        (plain.get("paths") or {}).get("log_dir"), (plain.get("paths") or {}).get("cache_dir"),
        (plain.get("data") or {}).get("cache_dir"), (plain.get("data") or {}).get("hf_cache_dir")) if p]
    where = "the run directory, paths.log_dir or the cache (" + ", ".join(map(str, dict.fromkeys(roots))) + ")"
    subdir = hydra.get("output_subdir")
    if subdir is not None and not _under(_real(Path(run_dir) / str(subdir), base), roots[:1]):
        raise ConfigError(f"hydra.output_subdir={subdir!r}: must be a folder inside the run directory {run_dir}")
    for section in SECTIONS:
        node = plain
        for part in section.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        for key, value in walk(node, section):
            name = key.rsplit(".", 1)[-1]
            if value is None or isinstance(value, (dict, list)) or not (name in PATH_KEYS or name in URL_KEYS):
                continue
            path = _path_of(key, name, value)
            if path is not None:
                check_path(key, path)
            if path is not None and not _under(_real(path, base), roots):
                raise ConfigError(f"{key}={value!r}: files may be written only under {where}")
            if section in LOGGING_SECTIONS and name == "filename" and not str(value).endswith(LOG_SUFFIX):
                raise ConfigError(f"{key}={value!r}: a log file's name must end in {LOG_SUFFIX} (a config chooses "
                                  "what its lines say, so under another name it could be a script)")
        for key, node in ((k, v) for k, v in walk(node, section) if isinstance(v, dict)):
            for name in ("name", "version", "id") if section == "logger" else ():  # "name": a folder if save_dir
                if node.get(name) not in (None, "") and (name != "name" or node.get("save_dir") is not None):
                    check_name(f"{key}.{name}", node[name])
            if node.get("sub_dir") not in (None, ""):
                check_path(f"{key}.sub_dir", str(node["sub_dir"]))
            if node.get("save_dir") is None or not any(node.get(k) not in (None, "") for k in SUBDIR_KEYS):
                continue
            parts = [str(node[k]) for k in SUBDIR_KEYS if node.get(k) not in (None, "")]
            folder = Path(str(node["save_dir"]), *parts)
            if not _under(_real(folder, base), roots):
                named = ", ".join(f"{k}={node[k]!r}" for k in SUBDIR_KEYS if node.get(k) not in (None, ""))
                raise ConfigError(f"{key}.save_dir={node['save_dir']!r} with {named}: the logger's folder "
                                  f"{folder} must be under {where}")
    for name, node in ((plain.get("logger") or {}).items()):
        if isinstance(node, dict) and "save_dir" in node and node["save_dir"] is None:
            raise ConfigError(f"logger.{name}.save_dir=None: give a folder under the run directory (the logger "
                              "would write into the current directory)")


def _path_of(key: str, name: str, value: Any) -> Path | None:
    """The file or folder a path-valued key names; URLs: sqlite files (storage) and file: URIs only."""
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigError(f"{key}={value!r}: give a path")
    text = str(value)
    if name not in URL_KEYS:
        return Path(text)
    for prefix in ("sqlite:///", "file://", "file:"):
        if text.startswith(prefix):
            return Path(text[len(prefix):])
    raise ConfigError(f"{key}={value!r}: only a local sqlite:///<file> (or file:) under the run directory, "
                      "paths.log_dir or the cache is allowed")


def _real(path: Path, base: Path) -> Path:
    return Path(os.path.realpath(path if path.is_absolute() else base / path))


def _under(path: Path, roots: list[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def check_links(folder: str | Path, inside: str | Path, what: str) -> None:
    """ConfigError if `folder`, or anything in it, is a symbolic link that leads out of `inside` (a dangling one
    too) or a file with a second hard link: mhalab writes into a run directory someone else may have made (resume,
    the analysis commands' default outputs) by fixed names, and such a link would carry a write elsewhere.
    Links that stay inside (wandb's `latest-run`) are fine; a folder that does not exist yet is fine."""
    folder, root = Path(folder), Path(os.path.realpath(inside))
    entries = [folder] if folder.is_symlink() or not folder.is_dir() else []
    for parent, dirs, files in ([] if entries else os.walk(folder)):
        entries += [Path(parent, name) for name in dirs + files]
    for path in entries:
        if path.is_symlink() and not _under(Path(os.path.realpath(path)), [root]):
            raise ConfigError(f"{path} is a symbolic link to {os.path.realpath(path)}, outside {inside}: refusing to "
                              f"{what} (remove the link, or copy the run without links)")
        if not path.is_symlink() and path.is_file() and path.stat().st_nlink > 1:
            raise ConfigError(f"{path} is a hard link shared with another file: refusing to {what} (copy the run "
                              "without links)")
