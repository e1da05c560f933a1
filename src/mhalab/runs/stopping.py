"""Stop signals: SIGINT (Ctrl-C), SIGTERM (what schedulers send) and SIGUSR1/2 (SLURM's warning before a time limit
or preemption) stop a run cleanly, whenever they come. One handler per process (`SIGNALS`) records the signal:

- from the moment `mhalab train` has checked its jobs (Hydra starting, imports) it is only recorded, and the job
  stops as its training would begin, with an "interrupted" summary and the command that resumes it;
- while training, `mhalab.training.callbacks.GracefulStop` stops at the next step boundary after saving last.ckpt;
- in data preparation, the last validation and testing (no step boundary comes) it stops at once (`Interrupted`).

A grid sweep whose jobs run on this machine (Hydra's basic or joblib launcher: `stops_as_a_whole`) stops as a whole.
A signal to the command, to any of its jobs or to their process group (Ctrl-C) leaves `<sweep_dir>/.stopped`; each
running job stops at its next step boundary, a job not yet started does not start, and the command prints one line
with the sweep's own resume command. Sweeps elsewhere (SLURM) and drawn as they go (Optuna) stop job by job.

A parallel sweep's workers (joblib's loky processes, children of the command's process) are supervised: a thread in
each watches its parent (`watch_parent`) and, when the command is gone however it died (SIGKILL included), stops the
job like SIGTERM does (last.ckpt, an "interrupted" summary, the sweep marked stopped); the worker then exits instead
of waiting for jobs no one will send, and a stop signal to an orphaned worker between jobs ends it. (Polling, not
`prctl(PR_SET_PDEATHSIG)`: that fires when the *thread* that started the worker ends, and loky starts replacement
workers from its manager thread.) Their DataLoader workers follow within seconds (torch's own watchdog).
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

from mhalab.atomic import write_atomic
from mhalab.locks import pid_alive

log = logging.getLogger("mhalab")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
STOPPED = ".stopped"  # in a sweep directory: the number of the signal that stopped the sweep
LOCAL_LAUNCHERS = ("BasicLauncher", "JoblibLauncher")
COMMAND_PID = "MHALAB_SWEEP_COMMAND"  # the command's pid, inherited by its workers (a death before a job began is seen)
PARENT_POLL_S = 0.5  # how often a parallel sweep's worker checks that the command that started it is alive


class Interrupted(Exception):
    """A run stopped by a signal; `exit_code` is 128 + the signal number."""

    def __init__(self, signum: int):
        self.signum, self.exit_code = signum, 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


class StopSignals:
    """This process's handler of the stop signals. It records the signal (`received`), marks the command's sweep
    stopped (`sweep_dir`), logs while training (`training`) and raises `Interrupted` where no step boundary comes
    (`now`). The handlers it replaced are kept (`original`: e.g. submitit's, which requeues a SLURM job)."""

    def __init__(self):
        self.received: int | None = None
        self.sweep_dir: Path | None = None
        self.now = self.training = self.command = self.in_job = False
        self.originals: dict[int, object] = {}
        self.parent: int | None = None  # a parallel sweep's worker: the pid of the command's process, watched

    def install(self) -> bool:
        """Handle the stop signals here (again after Lightning replaced a handler); True when newly installed."""
        new = not self.originals
        for sig in STOP_SIGNALS:
            self.originals.setdefault(sig, signal.getsignal(sig))
            signal.signal(sig, self._handle)
        return new

    def uninstall(self) -> None:
        """The handlers that were there before, and nothing recorded."""
        for sig, handler in self.originals.items():
            signal.signal(sig, handler)
        parent = self.parent
        self.__init__()
        self.parent = parent  # the watch goes on

    def original(self, signum: int):
        return self.originals.get(signum)

    def start_command(self, sweep_dir: Path | None) -> None:
        """`mhalab train` runs its jobs: record signals from now on; `sweep_dir`: a sweep that stops as a whole
        (a stale mark from an earlier stop is cleared: this command resumes it)."""
        self.install()
        self.command = True
        if sweep_dir is not None:
            os.environ[COMMAND_PID] = str(os.getpid())  # its workers (spawned from now on) watch this process
            (Path(sweep_dir) / STOPPED).unlink(missing_ok=True)
            self.sweep_dir = Path(sweep_dir)
            for name in launcher_loggers():
                if not any(isinstance(f, UnstartedJobs) for f in logging.getLogger(name).filters):
                    logging.getLogger(name).addFilter(UnstartedJobs())
            if self.received is not None:
                mark_stopped(self.sweep_dir, self.received)

    def start_job(self, sweep_dir: Path | None = None) -> None:
        """A job starts. In a launcher's worker process the handler is installed and stays, so that a signal between
        two jobs ends no worker (joblib would then tear down the others) but marks the sweep stopped, and a signal
        from before this job is forgotten (the sweep's mark says whether it still counts). `sweep_dir`: a sweep that
        stops as a whole; its workers watch the command's process (`watch_parent`)."""
        if not self.command:
            self.install()
            self.received = None
            if sweep_dir is not None:
                self.sweep_dir = Path(sweep_dir)
                self.watch_parent()
        self.in_job = True

    def job_begins(self, sweep_dir: Path | None = None) -> bool:
        """A job starts (`start_job`); False when its sweep was stopped before it began: it must not start. The watch
        starts first, so that a worker whose command is gone ends after this job even when it does not start."""
        self.start_job(sweep_dir)
        return sweep_dir is None or stopped(sweep_dir) is None

    def end_job(self) -> None:
        """A job has ended, however: a worker whose command is gone exits now (no job will come)."""
        self.in_job = False
        if self.orphaned():
            _exit(self.received or signal.SIGTERM)

    def watch_parent(self) -> None:
        """From now on, once the parent process is gone, stop as on SIGTERM (once per process)."""
        if self.parent is not None:
            return
        expected, ppid = os.environ.get(COMMAND_PID, ""), os.getppid()
        # the command's pid when it is gone already: a command SIGKILLed before this job began left the worker to
        # init, and watching init would never stop it; else the parent (a pid inherited from elsewhere that is alive
        # but not the parent is some other command's: an in-process sweep's, a test's)
        gone = expected.isdigit() and int(expected) != ppid and not pid_alive(int(expected))
        self.parent = parent = int(expected) if gone else ppid

        def watch():
            while os.getppid() == parent:
                time.sleep(PARENT_POLL_S)
            log.warning("the sweep's command (pid %d) is gone: stopping this job as on SIGTERM", parent)
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=watch, name="mhalab-parent-watch", daemon=True).start()

    def orphaned(self) -> bool:
        """A watched worker whose parent (the sweep's command) has died."""
        return self.parent is not None and os.getppid() != self.parent

    def requested(self, sweep_dir: Path | None = None) -> int | None:
        """The signal that stops this job: received here, or the one that stopped its sweep."""
        if self.received is not None:
            return self.received
        return stopped(sweep_dir) if sweep_dir is not None else None

    def _handle(self, signum, frame) -> None:
        if not self.in_job and self.orphaned():  # an idle worker of a dead command: nothing to save or wait for
            _exit(signum)
        first = self.received is None
        self.received = signum
        if self.sweep_dir is not None:
            mark_stopped(self.sweep_dir, signum)
        if self.now:
            raise Interrupted(signum)
        if first and self.training:
            log.warning("received %s: stopping at the next step boundary", signal.Signals(signum).name)


SIGNALS = StopSignals()
# the loggers of Hydra's local launchers, which announce each job ("\t#1 : seed=1") before it starts
JOBLIB_LOGGER = "hydra_plugins.hydra_joblib_launcher._core"


def launcher_loggers() -> tuple[str, str]:
    """The loggers of Hydra's basic launcher (its module: `mhalab.targets.hydra_basic`) and joblib's."""
    from mhalab.targets import hydra_basic

    return hydra_basic("launcher").rpartition(".")[0], JOBLIB_LOGGER


class UnstartedJobs(logging.Filter):
    """Drops a launcher's line announcing a job that has not started: the basic launcher's once the command's sweep
    is stopped (it announces each job just before running it), the joblib launcher's always (it announces every job
    up front; `announce_job` says it as the job begins instead)."""

    def filter(self, record: logging.LogRecord) -> bool:
        sweep_dir = SIGNALS.sweep_dir
        if sweep_dir is None or not record.getMessage().lstrip().startswith("#"):
            return True
        return record.name != JOBLIB_LOGGER and stopped(sweep_dir) is None


def announce_job(hc) -> None:
    """The joblib launcher's line for this job ("\t#1 : seed=1"), said as the job begins (in its worker), in place
    of the one the launcher said up front (`UnstartedJobs`)."""
    if str(hc.launcher.get("_target_", "")).rsplit(".", 1)[-1] == "JoblibLauncher":
        from hydra.core.utils import filter_overrides

        log.info("\t#%s : %s", hc.job.num, " ".join(filter_overrides(list(hc.overrides.task))))


def _exit(signum: int) -> None:
    """End this process now, with 128 + signum, after flushing what it logged and printed."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(128 + signum)


def stops_as_a_whole(hydra) -> bool:
    """Whether a multirun with this `hydra` config node stops as a whole: a grid (`mhalab.runs.sweeper.is_grid`)
    whose jobs run on this machine (the basic or joblib launcher)."""
    from omegaconf import OmegaConf

    from mhalab.runs.sweeper import is_grid

    sweeper = str(OmegaConf.select(hydra, "sweeper._target_", default=""))
    launcher = str(OmegaConf.select(hydra, "launcher._target_", default=""))
    return is_grid(sweeper) and launcher.rsplit(".", 1)[-1] in LOCAL_LAUNCHERS


def mark_stopped(sweep_dir: Path, signum: int) -> None:
    """No further job of this sweep starts, and those running stop at their next step boundary."""
    path = Path(sweep_dir) / STOPPED
    try:
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, str(signum))  # a reader never sees an empty mark
    except OSError:  # an unwritable sweep directory: its jobs still stop on their own signal
        pass


def stopped(sweep_dir: Path) -> int | None:
    """The signal that stopped this sweep, or None."""
    try:
        return int((Path(sweep_dir) / STOPPED).read_text())
    except (OSError, ValueError):
        return None


def sweep_stopped(argv: list[str], sweep_dir: Path, signum: int, began: bool) -> str:
    """The line a stopped sweep prints: what happened and the command that resumes it (`argv`: the command's;
    `began`: whether any job had begun)."""
    name = signal.Signals(signum).name
    if not began:
        return f"mhalab: the sweep stopped ({name}) before any job began; run the same command to start it again"
    named = any(a.startswith("hydra.sweep.dir=") or (a.startswith("resume=") and a.lower() != "resume=true")
                for a in argv)  # a sweep elsewhere than resume=true looks: named again
    args = [a for a in argv if not a.startswith(("resume=", "hydra.sweep.dir="))]
    resume = shlex.join(["mhalab", "train", *([] if {"-m", "--multirun"} & set(args) else ["-m"]), *args,
                         f"resume={sweep_dir}" if named else "resume=true"])
    return (f"mhalab: the sweep stopped ({name}): its running jobs saved their progress and an \"interrupted\" "
            f"summary, the others did not start; resume it with:\n  {resume}")
