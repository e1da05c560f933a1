"""A sweep never writes into a run directory another process holds (real processes holding real locks)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import proc_env

pytestmark = pytest.mark.proc  # every test here starts real processes

RUN = ["stats.importance=false", "stats.plots=false"]



def status(run_dir: Path) -> str:
    return json.loads((run_dir / "summary.json").read_text())["status"]


def test_a_sweep_never_writes_into_a_run_directory_another_process_holds(tmp_path, train):
    """Held before the command starts: the preflight refuses it and nothing is written. Taken while the sweep runs
    (job 0 started, job 1 not yet): job 1 says so and does not start, the holder's folder keeps only what it had and
    Hydra's bookkeeping (written before any job code runs), and the other job ends ok."""
    sweep = tmp_path / "sweep"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from mhalab.runs.rundir import RunLock\n"
         "sweep, job = Path(sys.argv[1]), sys.argv[2]\n"
         "while job == '1' and not (sweep / '0' / '.hydra').is_dir(): time.sleep(0.01)\n"
         "(sweep / job).mkdir(parents=True, exist_ok=True); (sweep / job / 'mine.txt').write_text('holder')\n"
         "RunLock(sweep / job).acquire(); print('locked', flush=True); sys.stdin.read()",
         str(sweep), "0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=proc_env())
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = sorted((p.relative_to(sweep), p.stat().st_mtime_ns) for p in sweep.rglob("*"))
        r = train(*RUN, f"hydra.sweep.dir={sweep}", "seed=0,1", multirun=True)
        assert r.returncode == 2 and "is in use by another process" in r.stderr, r.stderr[-3000:]
        assert sorted((p.relative_to(sweep), p.stat().st_mtime_ns) for p in sweep.rglob("*")) == before
    finally:
        holder.communicate("")
    late = tmp_path / "late"
    holder = subprocess.Popen(holder.args[:-2] + [str(late), "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=proc_env())
    try:
        r = train(*RUN, f"hydra.sweep.dir={late}", "seed=0,1", multirun=True)
        assert holder.stdout.readline().strip() == "locked"
    finally:
        holder.communicate("")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"error: job 1 of the sweep did not start: {late / '1'} is in use by another process (pid {holder.pid})" \
        in r.stderr
    assert sorted(p.name for p in (late / "1").iterdir()) == [".hydra", ".lock", "mine.txt", "train.log"]
    assert (late / "1" / "mine.txt").read_text() == "holder"
    assert status(late / "0") == "ok"


def test_a_requeued_slurm_job_waits_for_its_previous_start_to_let_go(tmp_path, monkeypatch):
    """SLURM can start a requeued job while its previous start is still saving and exiting: the new start waits
    for the lock (a real holder process), a first start does not."""
    from mhalab.runs import rundir as runs

    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from mhalab.runs.rundir import RunLock\n"
         "RunLock(Path(sys.argv[1])).acquire(); print('locked', flush=True); time.sleep(2)", str(tmp_path)],
        stdout=subprocess.PIPE, text=True, env=proc_env())
    try:
        assert holder.stdout.readline().strip() == "locked"
        monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
        try:
            runs.RunLock(tmp_path).acquire()
            raise AssertionError("a first start took a held lock")
        except runs.ConfigError as e:
            assert "is in use by another process" in str(e)
        monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
        lock = runs.RunLock(tmp_path)
        lock.acquire()  # waits until the holder exits
        assert holder.poll() is not None
        lock.release()
    finally:
        holder.kill()
