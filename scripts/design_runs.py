"""Keep a design's finished runs in the repository, so the design goes on after the machine that ran them is gone.

    python scripts/design_runs.py save EXPERIMENT      # logs/EXPERIMENT -> experiments/EXPERIMENT/runs/
    python scripts/design_runs.py restore EXPERIMENT   # experiments/EXPERIMENT/runs/ -> logs/EXPERIMENT

A design (scripts/run_design.py) costs tens of CPU-hours and a session's machine keeps nothing under logs/. `save`
packs what the design needs to resume and what its reports read, never a checkpoint, a lock or the frozen code
(rebuilt from its commit by run_design.py):
- each job that has finished into runs/<sweep>/<job>.tar.gz: its .hydra/, metrics, head statistics, summary and log.
  Finished: its summary says "ok" and was written a minute ago or more (its process has written its last lines), or
  it has a summary ("failed" too) in a sweep the state records as ended, or it was archived before. The archive is
  written once (what a later resume appends to the job's log is left out), so a later save adds only the new jobs'
  and git stores each once;
- the rest of logs/EXPERIMENT/design and logs/EXPERIMENT/multiruns into runs/design.tar.gz: the design's state (the
  frozen code's commit, the stages done; read before the jobs are judged, so it is never ahead of them), every
  sweep's own files, the reports, and of each job that has not finished its .hydra/ only (the config that names it
  in its sweep): resumed, such a job trains again from step 0, as a job killed before its first checkpoint does.
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
import sys
import tarfile
import time
import unicodedata
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import run_design  # noqa: E402  (one rule for what a design's state may name: run_design.bad_state)
from mhalab.atomic import write_atomic  # noqa: E402  (the project's one way to replace a file)

SKIPPED = {"checkpoints", "wandb", ".lock"}  # never archived: large, or a live process's
DESIGN = "design.tar.gz"
SETTLED_S = 60  # a job's summary this old: its process has written its last lines (the log's result line follows it)
MAX_BYTES = 1 << 28  # restore reads at most this much (a design's archives hold a few MB, unpacked some tens)


def logs_root() -> Path:
    return run_design.root() / "logs"


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
    """Every file below folder, sorted, but checkpoints, locks, wandb's files, links and unfinished writes."""
    keep: list[Path] = []
    for p in sorted(folder.iterdir()):
        if p.name.casefold() in SKIPPED or p.is_symlink() or p.suffix in (".tmp", ".partial"):
            continue
        keep += files_under(p) if p.is_dir() else [p] if p.is_file() else []
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
    write_atomic(out, raw.getvalue())
    return True


def save(experiment: str, to: Path) -> None:
    task_dir = logs_root() / experiment
    state = task_dir / "design" / "state.json"
    if not state.is_file():
        sys.exit(f"save {experiment}: {state} is missing: no design of that name ran here")
    state_bytes = state.read_bytes()  # first: the state saved is never ahead of the jobs judged below
    recorded = json.loads(state_bytes)
    why = run_design.bad_state(recorded, experiment)
    if why:
        sys.exit(f"save {experiment}: {state}: {why}")
    done = {run_design.sweep_here(d, experiment)  # sweeps that have ended
            for _, _, d in run_design.stage_dirs(recorded)}
    rest = [f for f in files_under(task_dir / "design") if not f.relative_to(task_dir / "design").parts[0].startswith(
        "code-")]
    jobs, new = 0, 0
    for sweep in sorted(d for d in (task_dir / "multiruns").glob("*") if d.is_dir()):
        rest += [f for f in sorted(sweep.iterdir()) if f.is_file() and not f.is_symlink()]
        for job in sorted(d for d in sweep.iterdir() if (d / ".hydra").is_dir() and not d.is_symlink()):
            out = to / job.relative_to(task_dir).parent / f"{job.name}.tar.gz"
            # final: archived before, settled "ok", or any job with a summary in a sweep that has ended ("failed" too)
            if out.exists() or finished(job) or (sweep in done and (job / "summary.json").is_file()):
                jobs += 1
                if not out.exists():  # written once: what a later resume appends to the job's log is left out
                    new += pack(named(files_under(job), task_dir, experiment), out)
            else:  # not finished: its config only, which names it in its sweep
                rest += files_under(job / ".hydra")
    pack(named(rest, task_dir, experiment, {state: state_bytes}), to / DESIGN)
    print(f"saved {jobs} finished jobs of {experiment} under {to} ({new} new), and the design's state")


def named(files: list[Path], task_dir: Path, experiment: str, read: dict | None = None) -> list[tuple[str, bytes]]:
    """(archive name, content) of each file; a name restore would refuse is a bug here, stopped before writing."""
    out = []
    for f in files:
        name = str(f.relative_to(task_dir.parent))
        why = refused(name, experiment)
        if why:
            sys.exit(f"save {experiment}: {name} would be archived, yet restore refuses it ({why}): nothing written")
        out.append((name, read[f] if read and f in read else f.read_bytes()))
    return out


def refused(name: str, experiment: str) -> str | None:
    """Why restore must not write a member of this name, or None: it takes back only what `save` writes (the
    design's files and its sweeps' under <experiment>/design and <experiment>/multiruns, names written plainly), so
    an archive from elsewhere can place no code (the frozen copy is rebuilt from its commit), checkpoint, lock or file
    outside the design; names are compared case-blind where a case-blind file system would merge them."""
    parts = Path(name).parts
    if (name != "/".join(parts) or Path(name).is_absolute() or ".." in parts or len(parts) < 3
            or parts[0] != experiment or parts[1] not in ("design", "multiruns")):
        return f"not a plainly named file under {experiment}/design or {experiment}/multiruns"
    if any(len(p.encode()) > 200 for p in parts):
        return "a name part longer than 200 bytes"
    if {p.casefold() for p in parts} & SKIPPED or (parts[1] == "design" and parts[2].casefold().startswith("code-")):
        return "which save never writes (a checkpoint, a lock, wandb's files or the design's code)"
    return None


def key(name: str) -> str:
    """A name as a case-blind, Unicode-normalising file system (macOS, Windows) sees it."""
    return unicodedata.normalize("NFC", name).casefold()


def read_archives(archives: list[Path], experiment: str) -> dict[Path, dict[str, bytes]]:
    """Every archive's files, checked (`refused`, no link, no name given twice, MAX_BYTES in all)."""
    out, seen, total = {}, {}, 0
    for archive in archives:
        files = out[archive] = {}
        try:
            with tarfile.open(archive, "r:gz") as tar:
                for info in tar:
                    why = refused(info.name, experiment) or (None if info.isfile() else "not a plain file")
                    total += info.size
                    if why is None and total > MAX_BYTES:
                        why = f"past {MAX_BYTES:,} bytes in all"
                    if why is None and key(info.name) in seen:
                        why = f"also in {seen[key(info.name)][0]}"
                    if why:
                        sys.exit(f"restore {experiment}: {archive} holds {info.name!r}, {why}: refused, nothing "
                                 "written")
                    seen[key(info.name)] = (archive, info.name)
                    files[info.name] = tar.extractfile(info).read()
        except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
            sys.exit(f"restore {experiment}: {archive} cannot be read ({type(e).__name__}: {e}): refused, nothing "
                     "written")
    for k, (archive, name) in seen.items():  # a file that is also another member's folder
        for parent in Path(k).parents:
            if str(parent) in seen:
                sys.exit(f"restore {experiment}: {archive} holds {name!r} inside {seen[str(parent)][1]!r}, a file of "
                         f"{seen[str(parent)][0]}: refused, nothing written")
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
    written: list[Path] = []
    try:
        for dest, data in todo:
            dest.parent.mkdir(parents=True, exist_ok=True)
            written.append(write_atomic(dest, data))
    except OSError as e:  # a full disk, say: what this restore wrote is taken back (write_atomic leaves no temporary)
        for f in written:
            f.unlink(missing_ok=True)
        sys.exit(f"restore {experiment}: writing under {root} failed ({e}); what this restore wrote is removed again")
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
