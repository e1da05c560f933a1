"""Each arm tuned, in two stages (issue 19's protocol; Zoology's per-model learning-rate sweep, then more seeds):

    python scripts/tuned_sweep.py EXPERIMENT --seeds-a 0,1,2 --seeds-b 3,4,5,6,7,8,9 [--grid optim.lr=1e-3,3.16e-3,1e-2]

Stage A runs every arm of `experiment=EXPERIMENT` at every value of the grid on the first seeds; `mhalab report`
then picks each arm's value on validation (most runs reaching the endpoint threshold, then the fewest steps, then
the best mean); stage B runs the remaining seeds of each arm at its own chosen value only. Both stages declare
`endpoint.selection_seeds` (the stage-A seeds), so `mhalab report` over every multirun folder it prints keeps the
choice made on stage A and tests it on the stage-B seeds alone. Run from the folder that holds
`logs/` (or set MHALAB_ROOT); extra arguments after `--` go to every `mhalab train`.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

MHALAB = [sys.executable, "-m", "mhalab"]
STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # passed on to the running sweep
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def train(args: list[str], announced=None) -> Path:
    """Run one `mhalab train -m` sweep, its output shown as it comes; the multirun folder it made, also given to
    `announced` as soon as the launcher names it, before any job starts. A stop signal to
    this process (SIGINT, SIGTERM, SIGHUP) is passed on to the sweep, which stops as it does on SIGTERM (running jobs
    save last.ckpt and an "interrupted" summary); if this process dies however (SIGKILL), the kernel sends the sweep
    SIGTERM (Linux), so no stage trains on unwatched."""
    print("$ mhalab train -m " + " ".join(args), flush=True)
    folder, stopped = None, []
    parent, passed = os.getpid(), [s for s in STOPS if signal.getsignal(s) is not signal.SIG_IGN]  # nohup: not HUP
    with subprocess.Popen([*MHALAB, "train", "-m", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, preexec_fn=lambda: _stop_with_parent(parent)) as proc:
        def forward(signum, frame):
            stopped.append(signum)
            proc.send_signal(signal.SIGTERM if signum == signal.SIGHUP else signum)

        before = {s: signal.signal(s, forward) for s in passed}
        try:
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()  # a design's log (a file: block-buffered) shows each line as the sweep writes it
                if "sweep output dir :" in line and folder is None:
                    folder = Path(line.split("sweep output dir :")[1].strip())
                    if announced:
                        announced(folder)
        finally:
            for s, handler in before.items():
                signal.signal(s, handler)
    if stopped:
        sys.exit(f"stopped by {signal.Signals(stopped[0]).name}: the sweep's running jobs saved their checkpoints; run "
                 "the same command again to resume")
    if proc.returncode != 0 or folder is None:
        sys.exit(f"stage failed (exit {proc.returncode}): mhalab train -m {' '.join(args)}")
    return folder


def _stop_with_parent(parent: int) -> None:
    """In the sweep's process, before it runs: a hang-up is ignored (mhalab has no stop handler for it; the runner
    passes a hang-up on as SIGTERM, which stops the sweep cleanly, also when a closing terminal signals the whole
    group), and SIGTERM comes when `parent`, the process that started it, dies (prctl PR_SET_PDEATHSIG; Linux only),
    also when it died before this call."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def chosen_cells(dirs: list[Path]) -> list[tuple[list[str], list[str]]]:
    """(arm overrides, chosen tuned overrides) per arm, as `mhalab report` picks them on validation."""
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([*MHALAB, "report", *map(str, dirs), "--out", out, "--no-plots"], check=True,
                       stdout=subprocess.DEVNULL)
        arms = json.loads((Path(out) / "report.json").read_text())["arms"]
    return [(a["label"].split(", "), a["chosen"].split(", ")) for a in arms]


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("experiment")
    p.add_argument("--seeds-a", required=True, help="seeds of stage A (every grid value), e.g. 0,1,2")
    p.add_argument("--seeds-b", required=True, help="seeds of stage B (each arm's chosen value only)")
    p.add_argument("--grid", default="optim.lr=1.0e-3,3.16e-3,1.0e-2", help="the tuned key and its values")
    args, extra = p.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    stages = f"endpoint.selection_seeds=[{args.seeds_a}]"
    a_dir = train([f"experiment={args.experiment}", f"seed={args.seeds_a}", args.grid, stages, *extra])
    dirs = [a_dir]
    for arm, chosen in chosen_cells([a_dir]):
        dirs.append(train([f"experiment={args.experiment}", f"seed={args.seeds_b}", *arm, *chosen, stages, *extra]))
    print("multirun folders, for mhalab report:", " ".join(map(str, dirs)))


if __name__ == "__main__":
    main(sys.argv[1:])
