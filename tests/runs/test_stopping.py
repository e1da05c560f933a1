"""Stop signals outside a single run's training (`mhalab.runs.stopping`), each with real processes and real signals:
a signal during start-up still leaves an "interrupted" summary and the command that resumes the run; Ctrl-C on a
parallel sweep saves every running job, starts no other, and prints one line with the sweep's own resume command."""

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TINY, proc_env, slow_except, wait_for

pytestmark = pytest.mark.proc  # every test here starts real processes

RUN = ["stats.importance=false", "stats.plots=false"]
MHALAB = [sys.executable, "-m", "mhalab"]



def status(run_dir: Path) -> str:
    return json.loads((run_dir / "summary.json").read_text())["status"]


@pytest.mark.slow
def test_sigterm_during_start_up_writes_an_interrupted_summary_and_the_resume_line(tmp_path, data_cache):
    args = [*TINY, *RUN, f"paths.root_dir={tmp_path}", f"data.cache_dir={data_cache}"]
    proc = subprocess.Popen([*MHALAB, "train", *args], cwd=tmp_path, env=proc_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    # Hydra has made the run directory: the job is starting (importing torch and Lightning), not training
    hydra_dir = wait_for(lambda: list(tmp_path.glob("logs/train/runs/*/.hydra")), "the run directory")[0]
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=240)
    run_dir = hydra_dir.parent
    assert proc.returncode == 143, err[-3000:]
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["status"] == "interrupted" and s["error"]["message"] == "stopped by SIGTERM at step 0", s
    assert s["timings"]["train_steps"] == 0
    assert "mhalab: stopped by SIGTERM at step 0; resume with:\n  mhalab train " in err and f"resume={run_dir}" in err
    assert "Traceback" not in err
    resumed = subprocess.run([*MHALAB, "train", *args, "resume=true"], cwd=tmp_path, env=proc_env(), capture_output=True,
                             text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert status(run_dir) == "ok"


@pytest.fixture(scope="module")
def ctrl_c_sweep(tmp_path_factory, data_cache):
    """A parallel sweep (two workers, three jobs) stopped by Ctrl-C, SIGINT to its process group as a terminal sends
    it, once both running jobs have a checkpoint: (its arguments, exit status, stdout, stderr, sweep directory)."""
    root = tmp_path_factory.mktemp("ctrl_c")
    # 400 steps a job: the second worker may start training 100 steps after the first on a loaded machine
    args = ["-m", "hydra/launcher=parallel", *TINY, *RUN, f"paths.root_dir={root}", f"data.cache_dir={data_cache}",
            "trainer.max_epochs=100", "trainer.limit_train_batches=4", "seed=0,1,2"]
    proc = subprocess.Popen([*MHALAB, "train", *args], cwd=root, env=proc_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    multiruns = root / "logs" / "train" / "multiruns"
    wait_for(lambda: len(list(multiruns.glob("*/*/checkpoints/last.ckpt"))) == 2, "both running jobs' checkpoints")
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=240)
    (sweep,) = multiruns.iterdir()
    return args, proc.returncode, out, err, sweep


def test_ctrl_c_on_a_parallel_sweep_saves_every_running_job_and_prints_the_sweeps_resume(ctrl_c_sweep):
    args, code, out, err, sweep = ctrl_c_sweep
    assert code == 130, err[-3000:]
    for job in ("0", "1"):
        s = json.loads((sweep / job / "summary.json").read_text())
        assert s["status"] == "interrupted" and s["error"]["message"].startswith("stopped by SIGINT at step "), s
        assert (sweep / job / "checkpoints" / "last.ckpt").is_file()
    assert not (sweep / "2").exists()  # not started, and no folder left that a report would list as failed
    resume = shlex.join(["mhalab", "train", *args, "resume=true"])
    ours = [line for line in err.splitlines() if line.startswith(("mhalab", "  mhalab"))]
    assert ours == ['mhalab: the sweep stopped (SIGINT): its running jobs saved their progress and an "interrupted" '
                    'summary, the others did not start; resume it with:', f"  {resume}"], err[-3000:]
    for noise in ("Traceback", "KeyboardInterrupt", "leaked semaphore", "resume="):
        assert noise not in out and noise not in err.replace(resume, ""), (noise, err[-3000:])


@pytest.mark.slow  # resumes three jobs; the default suite resumes a sweep in test_resume.py
def test_the_command_a_stopped_sweep_prints_finishes_every_job(ctrl_c_sweep):
    args, code, out, err, sweep = ctrl_c_sweep
    resume = err.splitlines()[-1].strip()
    assert resume == shlex.join(["mhalab", "train", *args, "resume=true"]), err[-3000:]
    resumed = subprocess.run([*MHALAB, *shlex.split(resume)[1:]], cwd=sweep.parents[3], env=proc_env(),
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [status(sweep / job) for job in ("0", "1", "2")] == ["ok", "ok", "ok"]
    assert not (sweep / ".stopped").exists()


@pytest.mark.parametrize("launcher, sig, to_group", slow_except([
    ("basic", signal.SIGINT, True),  # jobs run in the command's process, one after the other
    ("parallel", signal.SIGTERM, False),  # the command alone (kill PID): its workers get no signal
], keep=set()))  # in the default suite, a parallel sweep stopped as a whole: the ctrl_c_sweep tests above
def test_a_sweep_stops_as_a_whole_whichever_process_gets_the_signal(tmp_path, data_cache, launcher, sig, to_group):
    args = ["-m", f"hydra/launcher={launcher}", *TINY, *RUN, f"paths.root_dir={tmp_path}",
            f"data.cache_dir={data_cache}", "trainer.max_epochs=200", "trainer.limit_train_batches=4", "seed=0,1"]
    proc = subprocess.Popen([*MHALAB, "train", *args], cwd=tmp_path, env=proc_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    running = 1 if launcher == "basic" else 2
    multiruns = tmp_path / "logs" / "train" / "multiruns"
    wait_for(lambda: len(list(multiruns.glob("*/*/checkpoints/last.ckpt"))) == running, "the running jobs' checkpoints")
    (os.killpg if to_group else os.kill)(proc.pid, sig)
    out, err = proc.communicate(timeout=240)
    (sweep,) = multiruns.iterdir()
    assert proc.returncode == 128 + sig, err[-3000:]
    for job in range(running):
        s = json.loads((sweep / str(job) / "summary.json").read_text())
        assert s["status"] == "interrupted" and s["error"]["message"].startswith(f"stopped by {sig.name} at step "), s
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == [str(j) for j in range(running)]
    assert f"mhalab: the sweep stopped ({sig.name}): " in err and "Traceback" not in err, err[-3000:]
