"""Keep a design's finished runs in the repository, so the design goes on after the machine that ran them is gone.

    python scripts/design_runs.py save EXPERIMENT      # logs/EXPERIMENT -> experiments/EXPERIMENT/runs/
    python scripts/design_runs.py restore EXPERIMENT   # experiments/EXPERIMENT/runs/ -> logs/EXPERIMENT

A design (scripts/run_design.py) costs tens of CPU-hours and a session's machine keeps nothing under logs/. `save`
packs what the design needs to resume and what its reports read, never a checkpoint, a lock or the frozen code
(rebuilt from its commit by run_design.py):
- each job that finished (summary.json status "ok", written a minute ago or more: its process has written its last
  lines) into runs/<sweep>/<job>.tar.gz: its .hydra/, metrics, head statistics, summary and log. The archive is
  written once (what a later resume appends to the job's log is left out), so a later save adds only the new jobs'
  and git stores each once;
- the rest into runs/design.tar.gz: the design's state (the frozen code's commit, the stages done; read before the
  jobs are judged, so it is never ahead of them), every sweep's own files, the reports, and of each job that has not
  finished its .hydra/ only (the config that names it in its sweep): resumed, such a job trains again from step 0, as
  a job killed before its first checkpoint does.
Archives are byte-identical when the files are (sorted members, no time stamps, owners or modes of the machine).

`restore` unpacks them under logs/ (MHALAB_ROOT/logs when set) before `run_design.py EXPERIMENT` resumes. It takes back
only what `save` writes (`refused`) and refuses a file that is already there and differs, each in one sentence
with nothing written: it never replaces a run's results, and an archive handed over from elsewhere places no code.
A job already there with the same summary is left as it is.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import run_design  # noqa: E402  (one rule for what a design's state may name: run_design.bad_state)

SKIPPED = {"checkpoints", "wandb", ".lock"}  # never archived: large, or a live process's
DESIGN = "design.tar.gz"
SETTLED_S = 60  # a job's summary this old: its process has written its last lines (the log's result line follows it)
MAX_BYTES = 1 << 28  # restore reads at most this much (a design's archives hold a few MB, unpacked some tens)


def logs_root() -> Path:
    return Path(os.environ.get("MHALAB_ROOT", ".")) / "logs"


def finished(job: Path) -> bool:
    """The job's summary says "ok" and was written SETTLED_S ago or more (no lock is taken: a resumed sweep checking
    the job at that moment would find it in use)."""
    try:
        summary = job / "summary.json"
        return (json.loads(summary.read_text()).get("status") == "ok"
                and time.time() - summary.stat().st_mtime >= SETTLED_S)
    except (OSError, ValueError):
        return False


def files_under(folder: Path) -> list[Path]:
    """Every file to keep below folder, sorted; a job that has not finished gives its .hydra/ only."""
    keep: list[Path] = []
    for p in sorted(folder.iterdir()):
        if p.name in SKIPPED or p.name.startswith("code-") or p.is_symlink():
            continue
        if p.is_dir():
            keep += files_under(p / ".hydra") if (p / ".hydra").is_dir() and not finished(p) else files_under(p)
        elif p.is_file() and p.suffix != ".tmp":
            keep.append(p)
    return keep


def pack(members: list[tuple[str, bytes]], out: Path) -> bool:
    """(name, content) pairs into the gzipped tar `out`, the same bytes for the same pairs (no time, owner or mode
    of the machine); written whole or not at all, and only when it changes. True when written."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
        gz.write(buf.getvalue())
    if out.exists() and out.read_bytes() == raw.getvalue():
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(raw.getvalue())
    tmp.replace(out)
    return True


def save(experiment: str, to: Path) -> None:
    task_dir = logs_root() / experiment
    state = task_dir / "design" / "state.json"
    if not state.is_file():
        sys.exit(f"save {experiment}: {state} is missing: no design of that name ran here")
    state_bytes = state.read_bytes()  # first: the state saved is never newer than the jobs judged finished below
    everything = files_under(task_dir)
    jobs = sorted({f.parent for f in everything if f.name == "summary.json" and (f.parent / ".hydra").is_dir()})

    def named(files: list[Path]) -> list[tuple[str, bytes]]:
        return [(str(f.relative_to(task_dir.parent)), state_bytes if f == state else f.read_bytes()) for f in files]

    new = 0
    for job in jobs:  # a finished job's archive is written once: a later resume appends to its log, which is noise
        out = to / job.relative_to(task_dir).parent / f"{job.name}.tar.gz"
        if not out.exists():
            new += pack(named([f for f in everything if f.is_relative_to(job)]), out)
    pack(named([f for f in everything if not any(f.is_relative_to(j) for j in jobs)]), to / DESIGN)
    print(f"saved {len(jobs)} finished jobs of {experiment} under {to} ({new} new), and the design's state")


def refused(name: str, experiment: str) -> str | None:
    """Why restore must not write a member of this name, or None: it takes back only what `save` writes (the
    design's files and its sweeps' under <experiment>/design and <experiment>/multiruns), so an archive from
    elsewhere can place no code (the frozen copy is rebuilt from its commit), checkpoint, lock or file outside the
    design; names are compared case-blind where a case-blind file system would merge them."""
    parts = Path(name).parts
    if Path(name).is_absolute() or ".." in parts or len(parts) < 3 or parts[0] != experiment or parts[1] not in (
            "design", "multiruns"):
        return f"not a file under {experiment}/design or {experiment}/multiruns"
    if {p.casefold() for p in parts} & SKIPPED or (parts[1] == "design" and parts[2].casefold().startswith("code-")):
        return "which save never writes (a checkpoint, a lock, wandb's files or the design's code)"
    return None


def read_archives(archives: list[Path], experiment: str) -> dict[Path, dict[str, bytes]]:
    """Every archive's files, checked (`refused`, no link, no name given twice, MAX_BYTES in all)."""
    out, seen, total = {}, {}, 0
    for archive in archives:
        files = out[archive] = {}
        with tarfile.open(archive, "r:gz") as tar:
            for info in tar:
                why = refused(info.name, experiment) or (None if info.isfile() else "not a plain file")
                total += info.size
                if why is None and total > MAX_BYTES:
                    why = f"past {MAX_BYTES:,} bytes in all"
                if why is None and info.name in seen:
                    why = f"also in {seen[info.name]}"
                if why:
                    sys.exit(f"restore {experiment}: {archive} holds {info.name!r}, {why}: refused, nothing written")
                seen[info.name] = archive
                files[info.name] = tar.extractfile(info).read()
    names = set(seen)
    for name in names:  # a file that is also another member's folder
        for parent in Path(name).parents:
            if str(parent) in names:
                sys.exit(f"restore {experiment}: {seen[name]} holds {name!r} inside {str(parent)!r}, a file of "
                         f"{seen[str(parent)]}: refused, nothing written")
    return out


def restore(experiment: str, src: Path) -> None:
    if not (src / DESIGN).is_file():
        sys.exit(f"restore {experiment}: {src / DESIGN} does not exist (nothing saved for that design)")
    archives = sorted(src.rglob("*.tar.gz"))
    root, todo, read = logs_root(), [], read_archives(archives, experiment)
    state_name = f"{experiment}/design/state.json"
    try:
        why = run_design.bad_state(json.loads(read[src / DESIGN][state_name]), experiment)
    except (KeyError, ValueError) as e:
        why = f"no readable {state_name} ({type(e).__name__})"
    if why:
        sys.exit(f"restore {experiment}: the saved state: {why}: refused, nothing written")
    for archive, files in read.items():
        summary = next((n for n in files if n.endswith("/summary.json")), None)
        if archive.name != DESIGN and summary and (root / summary).is_file() and (
                root / summary).read_bytes() == files[summary]:
            continue  # this finished job is here already (a resume since may have added to its log)
        for name, data in files.items():
            dest = root / name
            for folder in [*reversed(Path(name).parents[:-1])]:
                if (root / folder).is_symlink() or (root / folder).exists() and not (root / folder).is_dir():
                    sys.exit(f"restore {experiment}: {root / folder} is not a folder here: refused, nothing written")
            if dest.is_symlink() or dest.exists() and (not dest.is_file() or dest.read_bytes() != data):
                sys.exit(f"restore {experiment}: {dest} is already there and differs from the saved one: move it "
                         "away first (restore never replaces a run's files); nothing written")
            if not dest.exists():
                todo.append((dest, data))
    for dest, data in todo:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".restoring")
        tmp.write_bytes(data)
        tmp.replace(dest)
    print(f"restored {len(archives) - 1} finished jobs of {experiment} under {root / experiment} ({len(todo)} files "
          f"written); resume with `python scripts/run_design.py {experiment}`")


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["save", "restore"])
    ap.add_argument("experiment", help="the design's experiment name (its logs/ folder and experiments/ folder)")
    ap.add_argument("--to", type=Path, default=None, help="the archives' folder (default experiments/EXPERIMENT/runs)")
    args = ap.parse_args(argv)
    folder = args.to or REPO / "experiments" / args.experiment / "runs"
    save(args.experiment, folder) if args.action == "save" else restore(args.experiment, folder)


if __name__ == "__main__":
    main(sys.argv[1:])
