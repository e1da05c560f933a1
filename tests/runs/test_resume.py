"""Runs you can trust: a run killed anywhere and resumed ends bit-identical to one never interrupted, whatever the
workers; signals leave a checkpoint and an "interrupted" summary; resume never loses or mixes up results.

The kills are real (SIGKILL at a named point, `mhalab.faults`); the full matrix of kill points x workers is
`slow`, the default run keeps one case of each kind."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import TINY, slow_except, summaries

from mhalab.errors import ConfigError
from mhalab.runs.preflight import preflight
from mhalab.runs.rundir import RunLock

# three short epochs of masked LM (dropout and random masking on), a validation and a step checkpoint every 2 steps
RUN = ["data=bbc_news_mlm", "trainer.max_epochs=3", "trainer.limit_train_batches=4", "trainer.log_every_n_steps=1",
       "trainer.val_check_interval=2", "checkpoint.every_n_steps=2"]
KILL_POINTS = {
    "during data preparation": "kill_at=prepare",
    "after a mid-epoch checkpoint": "kill_at_step=7",
    "during a checkpoint write": "kill_at=checkpoint_write@3",
    "during validation": "kill_at=validation@3",
    "during test": "kill_at=test",
    "after the summary": "kill_at=after_summary",
}


def results(summary: dict) -> dict:
    """What must not change: every metric, test metric, per-head result, the steps and tokens trained."""
    return {**{k: summary[k] for k in ("metrics", "test_metrics", "head_stats", "head_importance", "kv_groups")},
            "steps": summary["timings"]["train_steps"], "tokens": summary["timings"]["tokens_seen"]}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_cache):
    """The uninterrupted run, per number of workers (computed once, in this process)."""
    from mhalab.training.train import main

    cache = {}

    def get(workers: int) -> dict:
        if workers not in cache:
            root = tmp_path_factory.mktemp(f"reference{workers}")
            main([*TINY, *RUN, f"data.num_workers={workers}", f"paths.root_dir={root}", f"data.cache_dir={data_cache}"])
            (cache[workers],) = summaries(root / "logs")
        return cache[workers]

    return get


def kill_and_resume(run_train, tmp_path, fault: str, workers: int) -> tuple[subprocess.CompletedProcess, dict]:
    own_cache = [f"data.cache_dir={tmp_path / 'cache'}"] if "prepare" in fault else []
    killed = run_train(*RUN, f"data.num_workers={workers}", *own_cache, env={"MHALAB_FAULTS": fault})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = run_train(*RUN, f"data.num_workers={workers}", "resume=true", *own_cache)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (got,) = summaries(tmp_path / "logs")
    return resumed, got


@pytest.mark.proc
@pytest.mark.parametrize("point,workers", slow_except([("after a mid-epoch checkpoint", 0), ("during validation", 2)],
                                                     keep={("after a mid-epoch checkpoint", 0)}))
def test_kill_then_resume_is_bit_identical(run_train, tmp_path, reference, point, workers):
    resumed, got = kill_and_resume(run_train, tmp_path, KILL_POINTS[point], workers)
    assert "resuming from" in resumed.stdout + resumed.stderr
    assert len(list((tmp_path / "logs" / "train" / "runs").iterdir())) == 1  # the same run directory
    assert results(got) == results(reference(workers))  # exactly, not approximately


@pytest.mark.proc
@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_fault_matrix(run_train, tmp_path, reference, point, workers):
    _, got = kill_and_resume(run_train, tmp_path, KILL_POINTS[point], workers)
    assert results(got) == results(reference(workers))


# the GPU recipe (bf16-mixed) on the CPU, deterministic: the recipe turns it off (the GPU's fast kernels), and without
# it torch's CPU flash kernel for bf16 ended 1 run in 90 on another result (mhalab.attention.sdpa_backends)
BF16 = ["trainer=gpu", "trainer.accelerator=cpu", "trainer.deterministic=true"]
COMPILE = ["model.compile=true", "model.compile_backend=aot_eager"]  # torch.compile's tracing, without a C++ build


@pytest.mark.proc
@pytest.mark.slow  # a compiled or bf16 run killed and resumed: a minute each on 2 slow cores
@pytest.mark.parametrize("how", [BF16, COMPILE], ids=["bf16-mixed", "torch.compile"])
def test_a_gpu_option_killed_and_resumed_is_bit_identical(run_train, tmp_path, data_cache, how):
    """The `trainer=gpu` recipe on the CPU (bf16 autocast, float32 parameters and optimizer state in the
    checkpoint), and `model.compile` (the checkpoint holds the eager model's keys): killed after a mid-epoch
    checkpoint and resumed, each run ends exactly as its uninterrupted twin."""
    from mhalab.training.train import main

    root = tmp_path / "reference"
    main([*TINY, *RUN, *how, f"paths.root_dir={root}", f"data.cache_dir={data_cache}"])
    (reference,) = summaries(root / "logs")
    assert reference["config"]["trainer"]["precision"] == ("bf16-mixed" if how is BF16 else "32-true")
    assert reference["config"]["model"]["compile"] is (how is COMPILE)
    killed = run_train(*RUN, *how, env={"MHALAB_FAULTS": KILL_POINTS["after a mid-epoch checkpoint"]})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = run_train(*RUN, *how, "resume=true")
    assert resumed.returncode == 0 and "resuming from" in resumed.stdout + resumed.stderr, resumed.stderr[-3000:]
    (got,) = summaries(tmp_path / "logs")
    assert results(got) == results(reference)


def test_results_do_not_depend_on_the_number_of_workers(reference):
    assert results(reference(0)) == results(reference(2))


def stop_with(sig, args: list[str], cwd) -> tuple[subprocess.CompletedProcess, object]:
    """Start a run, send `sig` once its first checkpoint exists, return (what it printed, its run directory)."""
    proc = subprocess.Popen([sys.executable, "-m", "mhalab", "train", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(cwd.glob("logs/train/runs/*/checkpoints/last.ckpt")) and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    (run_dir,) = (cwd / "logs" / "train" / "runs").iterdir()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), run_dir


@pytest.mark.proc
@pytest.mark.slow  # the default suite keeps SIGINT (test_sigint_exits_130) and kill-and-resume
def test_sigterm_saves_writes_an_interrupted_summary_and_the_run_resumes(tmp_path, data_cache):
    args = [*TINY, *RUN, f"paths.root_dir={tmp_path}", f"data.cache_dir={data_cache}",
            "trainer.max_epochs=8"]  # long enough to be stopped (the signal comes at step 2 of 32), short to resume
    r, run_dir = stop_with(signal.SIGTERM, args, tmp_path)
    assert r.returncode == 143, r.stderr[-3000:]  # 128 + 15, not 0: a scheduler sees the job did not finish
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["status"] == "interrupted" and s["error"]["kind"] == "signal"
    assert "stopped by SIGTERM at step" in s["error"]["message"]
    assert "resume with:" in r.stderr and f"resume={run_dir}" in r.stderr
    step = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    assert step == s["timings"]["train_steps"]  # the checkpoint is the state the summary names
    resumed = subprocess.run([sys.executable, "-m", "mhalab", "train", *args, f"resume={run_dir}"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "ok"


@pytest.mark.proc
def test_sigint_exits_130_with_an_interrupted_summary(tmp_path, data_cache):
    r, run_dir = stop_with(signal.SIGINT, [*TINY, *RUN, f"paths.root_dir={tmp_path}", f"data.cache_dir={data_cache}",
                                           "trainer.max_epochs=30"], tmp_path)
    assert r.returncode == 130, r.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
    assert (run_dir / "checkpoints" / "last.ckpt").is_file() and "Traceback" not in r.stderr


def test_resume_on_a_finished_run_says_so_and_changes_nothing(train, tmp_path):
    assert train(*RUN).returncode == 0
    (run_dir,) = (tmp_path / "logs" / "train" / "runs").iterdir()
    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()}
    again = train(*RUN, "resume=true")
    assert again.returncode == 0 and "has finished" in again.stdout
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.is_file()} == before
    by_dir = train(*RUN, f"resume={run_dir}")
    assert by_dir.returncode == 0 and "has finished" in by_dir.stdout


@pytest.mark.proc
@pytest.mark.slow
def test_resume_refuses_other_overrides_and_picks_the_unfinished_run_not_a_finished_twin(run_train, train, tmp_path):
    killed = run_train(*RUN, env={"MHALAB_FAULTS": "kill_at_step=3"})
    assert killed.returncode == -signal.SIGKILL
    (unfinished,) = (tmp_path / "logs" / "train" / "runs").iterdir()
    overrides = (unfinished / ".hydra" / "overrides.yaml").read_text()
    with pytest.raises(ConfigError, match="that run was started with other values of optim.lr"):
        preflight([*TINY, *RUN, f"paths.root_dir={tmp_path}", "optim.lr=0.1", f"resume={unfinished}"])
    assert (unfinished / ".hydra" / "overrides.yaml").read_text() == overrides  # nothing rewritten
    assert train(*RUN).returncode == 0  # a newer twin, finished
    twin = next(d for d in (tmp_path / "logs" / "train" / "runs").iterdir() if d != unfinished)
    twin_summary = (twin / "summary.json").read_text()
    assert train(*RUN, "resume=true").returncode == 0
    assert json.loads((unfinished / "summary.json").read_text())["status"] == "ok"
    assert (twin / "summary.json").read_text() == twin_summary


@pytest.mark.proc
def test_a_second_process_cannot_work_in_a_locked_run(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text("- seed=1\n")
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from mhalab.runs.rundir import RunLock; "
                               f"RunLock({str(run_dir)!r}).acquire(); print('locked', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ConfigError, match=f"in use by another process \\(pid {holder.pid}\\)"):
            RunLock(run_dir).acquire()
        with pytest.raises(ConfigError, match="in use by another process"):
            preflight([f"paths.root_dir={tmp_path}", "seed=1", f"resume={run_dir}"])
    finally:
        holder.kill()
        holder.wait()
    lock = RunLock(run_dir)  # released by the kernel when its holder died
    lock.acquire()
    lock.release()


def test_interrupted_writes_leave_no_temporary_files_behind(tmp_path):
    from mhalab.runs.rundir import remove_stale_temporaries

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    stale = [run_dir / "checkpoints" / ".last.ckpt.abc.tmp", run_dir / ".summary.json.123.tmp"]
    for p in stale:
        p.write_bytes(b"half")
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"kept")
    assert sorted(remove_stale_temporaries(run_dir)) == sorted(stale)
    assert not any(p.exists() for p in stale) and (run_dir / "checkpoints" / "last.ckpt").exists()


@pytest.mark.proc
@pytest.mark.slow
def test_multirun_resume_finishes_only_the_unfinished_jobs(run_train, train, tmp_path):
    sweep = ["attention.n_heads=1,2", "stats=off"]
    killed = run_train(*sweep, multirun=True, env={"MHALAB_FAULTS": "kill_at_step=2"})  # the first job dies, taking the sweep
    assert killed.returncode == -signal.SIGKILL
    (sweep_dir,) = (tmp_path / "logs" / "train" / "multiruns").iterdir()
    r = train(*sweep, "resume=true", multirun=True)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = summaries(sweep_dir)
    assert sorted(s["architecture"]["attention"]["n_heads"] for s in runs) == [1, 2]
    assert all(s["status"] == "ok" for s in runs)
    assert len(list((tmp_path / "logs" / "train" / "multiruns").iterdir())) == 1


@pytest.mark.proc
@pytest.mark.slow  # `pytest -m slurm` requeues a job on a real cluster
def test_slurm_preemption_signal_requeues_and_the_requeued_job_continues(tmp_path, data_cache):
    """SLURM's warning signal (simulated): checkpoint, interrupted summary, `scontrol requeue <job>`, and the
    requeued job (SLURM_RESTART_COUNT=1, same directory) resumes from last.ckpt."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'scontrol.log'}\n")
    (bin_dir / "scontrol").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242"}
    run_dir = tmp_path / "logs" / "train" / "runs" / "job4242"
    args = [*TINY, *RUN, f"paths.root_dir={tmp_path}", f"data.cache_dir={data_cache}", "trainer.max_epochs=30",
            f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen([sys.executable, "-m", "mhalab", "train", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (run_dir / "checkpoints" / "last.ckpt").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGUSR1, err[-3000:]
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
    requeued = subprocess.run([sys.executable, "-m", "mhalab", "train", *args[:-2], "trainer.max_epochs=3",
                               f"hydra.run.dir={run_dir}"], cwd=tmp_path, capture_output=True, text=True,
                              env={**env, "SLURM_RESTART_COUNT": "1"}, timeout=600)
    assert "resuming from" in requeued.stdout + requeued.stderr


def test_the_slurm_launcher_config_matches_the_signal_handling():
    from mhalab.runs.preflight import compose

    launcher = compose(["hydra/launcher=slurm"]).hydra.launcher
    assert launcher.signal_delay_s > 0 and launcher.max_num_timeout >= 1


def test_a_run_recorded_before_the_gpu_keys_existed_still_resumes(train, tmp_path):
    """model.compile, model.compile_backend and optim.fused were added to the schema after runs were recorded: such
    a run's defining.json lacks them, and resume=true still finds it (it ran with their defaults)."""
    r = train("stats=off", "test=false")
    assert r.returncode == 0, r.stderr[-3000:]
    (run_dir,) = (tmp_path / "logs" / "train" / "runs").iterdir()
    path = run_dir / ".hydra" / "defining.json"
    recorded = json.loads(path.read_text())
    for node, key in (("model", "compile"), ("model", "compile_backend"), ("optim", "fused")):
        del recorded[node][key]
    path.write_text(json.dumps(recorded))
    again = train("stats=off", "test=false", "resume=true")
    assert again.returncode == 0 and "has finished" in again.stdout + again.stderr, again.stderr[-3000:]
    changed = train("stats=off", "test=false", "resume=true", "optim.fused=true")
    assert changed.returncode == 2 and "no run under" in changed.stderr
