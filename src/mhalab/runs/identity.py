"""A run's identity: what it computes (its resolved config without where it lives or how it is executed), recorded
as it starts and matched by `resume`, which continues the unfinished run (or sweep) that has the same identity.

The file keeps its first name, `.hydra/defining.json`, so runs recorded before the rename resume as they did."""

from __future__ import annotations

import json
from pathlib import Path

from mhalab.atomic import write_atomic
from mhalab.errors import ConfigError
from mhalab.runs.rundir import check_unlocked, launcher_rank
from mhalab.runs.summary import SUMMARY

IDENTITY = Path(".hydra") / "defining.json"  # what a run computes: its resolved config (written as it starts)
# keys that say where a run lives or how it is executed, never what it computes (results do not depend on
# data.num_workers: tests/runs/test_resume.py)
NOT_IDENTITY = ("hydra", "resume", "paths", "logger", "allowed_targets", "optimized_metric",
                "data.num_workers", "data.cache_dir", "data.hf_cache_dir")  # allowed_targets: in runs recorded
# before the allow-list moved to the command line (`--allow`); stripped so that they resume as they did
# keys added to the schema after runs were recorded, with the value those runs had: a run started before a key
# existed computed what its default computes, and resumes under it
ADDED_KEYS = {"model.compile": False, "model.compile_backend": "inductor", "optim.fused": None}


def _parent(tree: dict, key: str) -> tuple[dict | None, str]:
    """The dict that holds dotted `key` in a nested dict (None where a parent is missing), and the key's last part."""
    *parents, last = key.split(".")
    node = tree
    for p in parents:
        node = node.get(p) if isinstance(node, dict) else None
    return (node if isinstance(node, dict) else None), last


def identity(plain: dict) -> dict:
    """The resolved config without NOT_IDENTITY: two runs with the same identity compute the same."""
    out = json.loads(json.dumps(plain, default=str))
    for key in NOT_IDENTITY:
        node, last = _parent(out, key)
        if node is not None:
            node.pop(last, None)
    return out


def write_identity(run_dir: Path, plain: dict) -> None:
    """Record what a starting run computes (its resolved config), for `resume` to match on."""
    path = Path(run_dir) / IDENTITY
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(identity(plain), indent=1, sort_keys=True))


def run_identity(run_dir: Path) -> dict | None:
    """What a run recorded that it computes, or None (not started by this mhalab, or unreadable); keys the schema
    gained since (ADDED_KEYS) at the value the run had."""
    try:
        recorded = json.loads((Path(run_dir) / IDENTITY).read_text())
    except (OSError, ValueError):
        return None
    for key, value in ADDED_KEYS.items():
        node, last = _parent(recorded, key)
        if node is not None:
            node.setdefault(last, value)
    return recorded


def differences(a: dict | None, b: dict, prefix: str = "") -> list[str]:
    """The dotted keys whose resolved values differ between two identities."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return [prefix or "the config"] if a != b else []
    out = []
    for key in sorted(set(a) | set(b)):
        out += differences(a.get(key), b.get(key), f"{prefix}.{key}" if prefix else key) \
            if isinstance(a.get(key), dict) and isinstance(b.get(key), dict) else \
            ([f"{prefix}.{key}" if prefix else key] if a.get(key) != b.get(key) else [])
    return out


def run_status(run_dir: Path) -> str | None:
    """The status in a run's summary.json ("ok", "failed", "interrupted"), or None without a readable one."""
    from mhalab.runs.summary import read_summary

    if not (run_dir / SUMMARY).is_file():
        return None
    try:
        return read_summary(run_dir).status
    except ConfigError:
        return None


def resume_target(tc, runs_dir: Path) -> Path | None:
    """The run directory `resume` continues, matched on the resolved config; None when that run has finished."""
    if tc.resume is True:
        same = [d for d in (runs_dir.iterdir() if runs_dir.is_dir() else [])
                if d.is_dir() and run_identity(d) == tc.identity]
        unfinished = [d for d in same if run_status(d) != "ok"]
        if not unfinished:
            if same:
                raise Finished(max(same, key=lambda d: d.name))
            raise ConfigError(f"resume=true: no run under {runs_dir} has this config; run without resume, or "
                              "give resume=<run_dir>")
        run_dir = max(unfinished, key=lambda d: d.name)  # names start with the start time
    else:
        run_dir = Path(str(tc.resume)).expanduser().resolve()
        if not (run_dir / ".hydra").is_dir():
            raise ConfigError(f"resume={tc.resume}: {run_dir} is not a run directory (no .hydra folder)")
        check_unlocked(run_dir)
        theirs = run_identity(run_dir)
        if theirs is None:
            raise ConfigError(f"resume={tc.resume}: that run has no {IDENTITY} (started by an older mhalab); "
                              "start it again")
        diff = differences(theirs, tc.identity)
        if diff:
            raise ConfigError(f"resume={tc.resume}: that run was started with other values of {', '.join(diff[:5])}; "
                              "give the same config to resume it")
        if run_status(run_dir) == "ok":
            raise Finished(run_dir)
    check_unlocked(run_dir)
    from mhalab.config.writes import check_links

    check_links(run_dir, run_dir, "resume there")  # a resumed run writes its files there by their fixed names
    return run_dir.resolve()


def resume_sweep(tc, jobs: list, multiruns_dir: Path) -> Path:
    """The sweep directory a multirun `resume` continues: each job folder there holds that job's config (or
    nothing yet)."""
    def matches(sweep_dir: Path) -> bool:
        return all(run_identity(sweep_dir / str(i)) in (None, job.identity) for i, job in enumerate(jobs))

    if tc.resume is True:
        found = sorted((d for d in (multiruns_dir.iterdir() if multiruns_dir.is_dir() else [])
                        if d.is_dir() and any(run_identity(d / str(i)) for i in range(len(jobs))) and matches(d)),
                       key=lambda d: d.name)
        if not found:
            raise ConfigError(f"resume=true: no sweep under {multiruns_dir} has these jobs; run without resume, or "
                              "give resume=<sweep_dir>")
        sweep_dir = found[-1]
    else:
        sweep_dir = Path(str(tc.resume)).expanduser().resolve()
        if not sweep_dir.is_dir() or not matches(sweep_dir):
            raise ConfigError(f"resume={tc.resume}: the job folders there do not hold these jobs' configs "
                              "(the sweep must be given exactly as it was started)")
    for i in range(len(jobs)):
        if (sweep_dir / str(i)).is_dir():
            check_unlocked(sweep_dir / str(i))
    from mhalab.config.writes import check_links

    check_links(sweep_dir, sweep_dir, "resume the sweep there")
    return sweep_dir.resolve()


RUN_MARKS = (SUMMARY, "checkpoints", ".hydra")  # what a started run leaves in its directory


def holds_run(directory: Path) -> list[str]:
    """What of a run (RUN_MARKS) a directory holds; empty when none."""
    return [m for m in RUN_MARKS if (directory / m).exists()]


def check_not_a_run(directory: Path, key: str) -> None:
    """ConfigError when a run directory (`hydra.run.dir`) or a sweep directory (`hydra.sweep.dir`: any of its job
    folders) already holds a run: a new run there would replace its results. A requeued SLURM job continues in its
    own directory, and DDP's other ranks work in rank 0's."""
    from mhalab.runs.slurm import requeued

    if requeued() or launcher_rank() > 0 or not directory.is_dir():
        return
    found = holds_run(directory)
    if key == "hydra.sweep.dir":
        found += [f"{d.name}/{m}" for d in sorted(directory.iterdir()) if d.is_dir() for m in holds_run(d)]
    if found:
        raise ConfigError(f"{key}={directory} already holds a run ({', '.join(found[:3])}): a new run there would "
                          f"replace its results; resume it with resume={directory}, or choose a new directory "
                          f"(leave {key} out and each command gets its own)")


class Finished(Exception):
    """The run to resume has finished: nothing to do (not an error)."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        super().__init__(f"{run_dir} has finished (summary.json status ok); nothing to resume")
