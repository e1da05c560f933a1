"""Supervised sweep workers (`mhalab.runs.stopping`, "supervised"), with real processes: a parallel sweep whose
command is SIGKILLed leaves no process behind (loky workers, their DataLoader workers, loky's trackers), each
running job stops as on SIGTERM with a checkpoint and an "interrupted" summary, and `resume=true` finishes the sweep."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import TINY, proc_env, session, wait_for
from test_stopping import RUN, status

pytestmark = pytest.mark.proc  # every test here starts real processes

MHALAB = [sys.executable, "-m", "mhalab"]
GRACE_S = 10  # how long any process of the sweep may outlive its command


@pytest.mark.slow  # about 2 minutes on 2 shared cores: two sweeps' start-up and 240 steps
def test_a_sigkilled_parallel_sweep_leaves_no_worker_and_resumes(tmp_path, data_cache):
    # data.num_workers=1: every job has a DataLoader worker too; 30 epochs of 4 steps: still training when killed
    args = ["-m", "hydra/launcher=parallel", *TINY, *RUN, f"paths.root_dir={tmp_path}", f"data.cache_dir={data_cache}",
            "trainer.max_epochs=30", "trainer.limit_train_batches=4", "data.num_workers=1", "seed=0,1"]
    proc = subprocess.Popen([*MHALAB, "train", *args], cwd=tmp_path, env=proc_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    multiruns = tmp_path / "logs" / "train" / "multiruns"
    try:
        wait_for(lambda: len(list(multiruns.glob("*/*/checkpoints/last.ckpt"))) == 2, "both jobs' checkpoints")
        before = session(proc.pid)
        assert "pt_data_worker" in before.values() and len(before) >= 5, before  # command, 2 workers, 2+ loaders
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        killed = time.monotonic()
        left = session(proc.pid)
        while left and time.monotonic() - killed < GRACE_S:
            time.sleep(0.1)
            left = session(proc.pid)
        assert not left, f"still running {GRACE_S} s after the command was killed: {left}"
    finally:
        for pid in session(proc.pid):  # a failed check leaves nothing running
            os.kill(pid, signal.SIGKILL)
    (sweep,) = multiruns.iterdir()
    for job in ("0", "1"):
        s = json.loads((sweep / job / "summary.json").read_text())
        assert s["status"] == "interrupted" and s["error"]["message"].startswith("stopped by SIGTERM at step "), s
        assert (sweep / job / "checkpoints" / "last.ckpt").is_file()
    logs = "".join((sweep / job / "train.log").read_text() for job in ("0", "1"))
    assert "the sweep's command (pid " in logs, logs[-3000:]
    resumed = subprocess.run([*MHALAB, "train", *args, "resume=true"], cwd=tmp_path, env=proc_env(), capture_output=True,
                             text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [status(sweep / job) for job in ("0", "1")] == ["ok", "ok"]
    for job in ("0", "1"):
        assert json.loads((sweep / job / "summary.json").read_text())["timings"]["train_steps"] == 120


def test_an_idle_worker_outlives_a_signal_while_its_command_lives_and_ends_once_it_is_gone(tmp_path):
    """A worker between jobs keeps its stop handler, so a signal ends no worker while the sweep runs (it marks the
    sweep stopped); once its command is gone it ends: the orphans that "ignored SIGTERM" in the issue."""
    code = """
import os, sys, time
from mhalab.runs.stopping import SIGNALS
if os.fork() == 0:  # the worker: one job of a sweep that stops as a whole, then idle
    SIGNALS.start_job(sys.argv[1])
    SIGNALS.end_job()
    print(os.getpid(), flush=True)
    time.sleep(60)
    os._exit(0)
time.sleep(60)  # the command
"""
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True, env=proc_env())
    try:
        worker = int(proc.stdout.readline())
        os.kill(worker, signal.SIGTERM)
        wait_for(lambda: (tmp_path / ".stopped").is_file(), "the sweep's mark", timeout=10)
        assert (tmp_path / ".stopped").read_text() == str(int(signal.SIGTERM))
        time.sleep(0.5)
        assert worker in session(proc.pid)  # the signal ended no job and no worker
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        wait_for(lambda: worker not in session(proc.pid), "the orphaned worker to end", timeout=GRACE_S)
    finally:
        for pid in session(proc.pid):
            os.kill(pid, signal.SIGKILL)


def test_a_worker_whose_sweep_was_stopped_and_whose_command_died_before_its_job_began_ends(tmp_path):
    """The race CI met: one worker's job stopped the sweep and the command was SIGKILLed before the other worker's
    job began (it was still importing). That job does not start, and its worker, now an orphan, ends instead of waiting
    idle for loky's timeout, also while its dead command is a zombie no one has reaped yet."""
    code = """
import os, signal, sys, time
from mhalab.runs.stopping import SIGNALS, COMMAND_PID, mark_stopped
command = os.getpid()
os.environ[COMMAND_PID] = str(command)
dead_r, dead_w = os.pipe()
if os.fork() == 0:  # the worker
    os.close(dead_w)
    os.read(dead_r, 1)  # end of file: the command is dying (the kernel closes its files first)
    while os.getppid() == command:  # ... and hands its children to init after: then it has died
        time.sleep(0.01)
    began = SIGNALS.job_begins(sys.argv[1])
    SIGNALS.end_job()
    print("began" if began else "left idle", flush=True)
    time.sleep(60)
    os._exit(0)
mark_stopped(sys.argv[1], signal.SIGTERM)  # the other worker's job, stopped as on SIGTERM
os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True, env=proc_env())
    try:
        time.sleep(2)  # the command stays a zombie meanwhile: the worker's job looks at it before it is reaped
        assert proc.wait(timeout=30) == -signal.SIGKILL
        wait_for(lambda: not session(proc.pid), "the orphaned worker to end", timeout=GRACE_S)
        assert proc.stdout.read() == ""  # it ended at its job's end, before printing
    finally:
        for pid in session(proc.pid):
            os.kill(pid, signal.SIGKILL)
