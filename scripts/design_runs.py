"""Keep a design's finished runs in the repository, so the design goes on after the machine that ran them is gone.

    python scripts/design_runs.py save EXPERIMENT      # logs/EXPERIMENT -> experiments/EXPERIMENT/runs/
    python scripts/design_runs.py restore EXPERIMENT   # experiments/EXPERIMENT/runs/ -> logs/EXPERIMENT

A design (scripts/run_design.py) costs tens of CPU-hours and a session's machine keeps nothing under logs/. `save`
packs what the design needs to resume and what its reports read, never a checkpoint, a lock or the frozen code
(rebuilt from its commit by run_design.py):
- each job that finished (summary.json status "ok") into runs/<sweep>/<job>.tar.gz: its .hydra/, metrics, head
  statistics, summary and log. A finished job never changes, so its archive is written once and a later save adds
  only the new jobs' (git stores each once);
- the rest into runs/design.tar.gz: the design's state (the frozen code's commit, the stages done), every sweep's own
  files, the reports, and of each job that has not finished its .hydra/ only (the config that names it in its sweep):
  resumed, such a job trains again from step 0, as a job killed before its first checkpoint does.
Archives are byte-identical when the files are (sorted members, no owner, no gzip time stamp).

`restore` unpacks them under logs/ (MHALAB_ROOT/logs when set) before `run_design.py EXPERIMENT` resumes; it refuses a
file that is already there and differs (one sentence, nothing written), so it never replaces a run's results.
"""

from __future__ import annotations

import argparse
import fcntl
import gzip
import io
import json
import os
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SKIPPED = {"checkpoints", "wandb", ".lock"}  # never archived: large, or a live process's
DESIGN = "design.tar.gz"


def logs_root() -> Path:
    return Path(os.environ.get("MHALAB_ROOT", ".")) / "logs"


def finished(job: Path) -> bool:
    """The job's summary says "ok" and no process holds its lock (a job that has just written its summary may still
    be writing its log)."""
    try:
        if json.loads((job / "summary.json").read_text()).get("status") != "ok":
            return False
    except (OSError, ValueError):
        return False
    try:
        fd = os.open(job / ".lock", os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


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


def pack(files: list[Path], base: Path, out: Path) -> None:
    """files (named relative to base) into the gzipped tar `out`, written whole or not at all."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for f in files:
            info = tar.gettarinfo(f, arcname=str(f.relative_to(base)))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(f, "rb") as fh:
                tar.addfile(info, fh)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
        gz.write(buf.getvalue())
    tmp.replace(out)


def save(experiment: str, to: Path) -> None:
    task_dir = logs_root() / experiment
    if not (task_dir / "design" / "state.json").is_file():
        sys.exit(f"save {experiment}: {task_dir}/design/state.json is missing: no design of that name ran here")
    everything = files_under(task_dir)
    jobs = sorted({f.parent for f in everything if f.name == "summary.json" and (f.parent / ".hydra").is_dir()})
    new = 0
    for job in jobs:
        out = to / job.relative_to(task_dir).parent / f"{job.name}.tar.gz"
        if not out.exists():
            pack([f for f in everything if f.is_relative_to(job)], task_dir.parent, out)
            new += 1
    pack([f for f in everything if not any(f.is_relative_to(j) for j in jobs)], task_dir.parent, to / DESIGN)
    print(f"saved {len(jobs)} finished jobs of {experiment} under {to} ({new} new), and the design's state")


def refused(info: tarfile.TarInfo, experiment: str) -> str | None:
    """Why restore must not write this member, or None: it takes back only what `save` writes, so an archive from
    elsewhere can place no code (the frozen copy is rebuilt from its commit), checkpoint or link."""
    name = Path(info.name)
    if name.is_absolute() or ".." in name.parts or name.parts[0] != experiment or not info.isfile():
        return f"not a file under {experiment}/"
    code = len(name.parts) > 2 and name.parts[1] == "design" and name.parts[2].startswith("code-")
    if code or set(name.parts) & SKIPPED:
        return "which save never writes (a checkpoint, a lock, wandb's files or the design's code)"
    return None


def restore(experiment: str, src: Path) -> None:
    archives = sorted(src.rglob("*.tar.gz"))
    if not (src / DESIGN).is_file():
        sys.exit(f"restore {experiment}: {src / DESIGN} does not exist (nothing saved for that design)")
    root, todo = logs_root(), []
    for archive in archives:
        with tarfile.open(archive, "r:gz") as tar:
            for info in tar.getmembers():
                why = refused(info, experiment)
                if why:
                    sys.exit(f"restore {experiment}: {archive} holds {info.name!r}, {why}: refused, nothing written")
                dest = root / info.name
                if dest.exists() and dest.read_bytes() != tar.extractfile(info).read():
                    sys.exit(f"restore {experiment}: {dest} is already there and differs from the saved one: move it "
                             "away first (restore never replaces a run's files); nothing written")
        todo.append(archive)
    for archive in todo:
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(root, members=[i for i in tar.getmembers() if not (root / i.name).exists()],
                           filter="data")
    print(f"restored {len(archives) - 1} finished jobs of {experiment} under {root / experiment}; resume with "
          f"`python scripts/run_design.py {experiment}`")


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
