"""mhalab on a real SLURM cluster: a private one-node cluster on this machine (scripts/slurm_cluster.py: munged,
slurmctld, slurmd), not a fake scontrol. Marked `slurm` (run with `pytest -m slurm`); skipped where slurm-wlm and
munge are not installed.

- the launcher's resources are checked by the cluster (`sbatch --test-only`) before anything is written;
- a launcher sweep runs as an array job, each job with the CPUs SLURM gave it;
- SLURM's warning signal to a launcher job: it saves, submitit requeues it, and the requeued job ends bit-identical
  to a run never interrupted;
- the sbatch script of docs/cluster.md, as written, preempted and requeued the same way.
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, TINY, refusal, summaries, wait_for
from test_resume import RUN, results

spec = importlib.util.spec_from_file_location("slurm_cluster", REPO / "scripts" / "slurm_cluster.py")
slurm_cluster = importlib.util.module_from_spec(spec)
spec.loader.exec_module(slurm_cluster)

pytestmark = [pytest.mark.slurm, pytest.mark.proc,
              pytest.mark.skipif(bool(slurm_cluster.missing()), reason="SLURM is not installed (slurm-wlm, munge)")]

LONG = [*RUN, "trainer.max_epochs=30"]  # 120 steps: long enough to be signalled after the first checkpoint


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with slurm_cluster.Cluster(tmp_path_factory.mktemp("cluster")) as c:
        yield c


def env_of(cluster, tmp_path) -> dict:
    bin_dir = str(Path(sys.executable).parent)  # the README's script calls `mhalab`, as a user's PATH has it
    return {**cluster.env, "MHALAB_ROOT": str(tmp_path), "WANDB_SILENT": "true",
            "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def scontrol(cluster, *args) -> str:
    return subprocess.run(["scontrol", *args], capture_output=True, text=True, env=cluster.env).stdout


def job_field(cluster, job: str, key: str) -> str | None:
    m = re.search(rf"\b{key}=(\S+)", scontrol(cluster, "show", "job", job))
    return m.group(1) if m else None


def start_requeued(cluster, job: str) -> None:
    """Wait until the requeued job is pending on its BeginTime and its first start's batch step is done on the node,
    then let it start now. SLURM's BeginTime (about two minutes) is what gives a real cluster that time: a start
    released sooner is refused by slurmd ("Job credential revoked": it revokes the first start's credential with
    one-second resolution) and the job ends FAILED, as CI saw."""
    wait_for(lambda: job_field(cluster, job, "Restarts") == "1" and job_field(cluster, job, "JobState") == "PENDING",
             f"job {job} to be requeued", 120)
    raw = job_field(cluster, job, "JobId")
    log = cluster.root / "slurmd.log"
    wait_for(lambda: f"[{raw}.batch] done with job" in log.read_text(errors="replace"),
             f"the first start of job {job} to end on the node", 120)
    time.sleep(2)  # past the second in which slurmd revoked the first start's credential
    scontrol(cluster, "update", f"jobid={job}", "StartTime=now")


def what_slurm_said(cluster, job: str) -> str:
    """The job's record and the daemons' lines about it, for a failure message."""
    lines = [ln for name in ("slurmctld.log", "slurmd.log") if (cluster.root / name).is_file()
             for ln in (cluster.root / name).read_text(errors="replace").splitlines() if f"{job}" in ln]
    return scontrol(cluster, "show", "job", job) + "\n".join(lines[-40:])


def reference(tmp_path_factory, data_cache, threads: int, *extra) -> dict:
    """The same run, never interrupted, in this process."""
    from mhalab.training.train import main

    root = tmp_path_factory.mktemp("reference")
    main([*TINY, *LONG, f"torch_threads={threads}", *extra, f"paths.root_dir={root}", f"data.cache_dir={data_cache}"])
    (got,) = summaries(root / "logs")
    return got


def test_resources_the_cluster_refuses_are_one_sentence_before_anything_is_written(cluster, tmp_path, data_cache):
    r = subprocess.run([sys.executable, "-m", "mhalab", "train", "-m", "hydra/launcher=slurm",
                        "hydra.launcher.cpus_per_task=64", "seed=0,1", *TINY, f"data.cache_dir={data_cache}"],
                       cwd=tmp_path, env=env_of(cluster, tmp_path), capture_output=True, text=True, timeout=120)
    line = refusal(r)
    assert line.startswith("error: SLURM refuses the launcher's resources") and "cpus_per_task" in line
    assert not (tmp_path / "logs").exists() and not cluster.jobs()


def test_a_launcher_sweep_runs_as_an_array_job_with_the_cpus_it_was_given(cluster, tmp_path, data_cache):
    r = subprocess.run([sys.executable, "-m", "mhalab", "train", "-m", "hydra/launcher=slurm",
                        "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1", "seed=0,1", *TINY,
                        f"data.cache_dir={data_cache}"],
                       cwd=tmp_path, env=env_of(cluster, tmp_path), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = summaries(tmp_path / "logs")
    assert sorted(s["config"]["seed"] for s in got) == [0, 1] and {s["status"] for s in got} == {"ok"}
    jobs = {s["environment"]["slurm_job"] for s in got}
    assert len(jobs) == 2 and None not in jobs  # two tasks of one array job, run by SLURM
    assert {s["environment"]["torch_threads"] for s in got} == {1}  # SLURM gave 1 CPU of the node's 2


def test_a_preempted_launcher_job_is_requeued_and_ends_bit_identical(cluster, tmp_path, data_cache,
                                                                    tmp_path_factory):
    args = [sys.executable, "-m", "mhalab", "train", "-m", "hydra/launcher=slurm", "hydra.launcher.cpus_per_task=1",
            "hydra.launcher.mem_gb=1", "seed=0", *TINY, *LONG, "torch_threads=1", f"data.cache_dir={data_cache}"]
    sweep = subprocess.Popen(args, cwd=tmp_path, env=env_of(cluster, tmp_path), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        ckpt = wait_for(lambda: list(tmp_path.glob("logs/train/multiruns/*/0/checkpoints/last.ckpt")),
                        "the job's first checkpoint", 300)
        (job,) = cluster.jobs()
        subprocess.run(["scancel", "--signal=USR2", job], env=cluster.env, check=True)  # SLURM's warning signal
        run_dir = ckpt[0].parents[1]
        wait_for(lambda: (run_dir / "summary.json").exists(), "the interrupted summary", 120)
        assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
        start_requeued(cluster, job)
        out, err = sweep.communicate(timeout=600)
    finally:
        sweep.kill()
    assert sweep.returncode == 0, err[-3000:]
    (got,) = summaries(tmp_path / "logs")
    assert got["status"] == "ok" and job_field(cluster, job, "Restarts") == "1"
    assert "resuming from" in (run_dir / "train.log").read_text()
    assert results(got) == results(reference(tmp_path_factory, data_cache, 1, "seed=0"))  # exactly


def readme_sbatch_script() -> str:
    text = (REPO / "docs" / "cluster.md").read_text()
    m = re.search(r"One run from a plain batch script.*?```bash\n(.*?)```", text, re.S)
    assert m, "docs/cluster.md has no sbatch script after 'One run from a plain batch script'"
    return m.group(1)


def test_the_readme_sbatch_script_as_written_is_requeued_and_ends_bit_identical(cluster, tmp_path, data_cache,
                                                                              tmp_path_factory):
    script = readme_sbatch_script()
    line = next(ln for ln in script.splitlines() if ln.startswith("exec mhalab train"))
    command = line.split("#")[0].rstrip()  # the README's own command, with tiny settings added after it
    tiny = " ".join([*TINY, *LONG, f"data.cache_dir={data_cache}"])
    (tmp_path / "train.sbatch").write_text(script.replace(line, f"{command} {tiny}"))
    job = subprocess.run(["sbatch", "--parsable", "train.sbatch"], cwd=tmp_path, env=env_of(cluster, tmp_path),
                         capture_output=True, text=True, check=True).stdout.strip()
    run_dir = tmp_path / "logs" / "train" / "runs" / job
    wait_for(lambda: (run_dir / "checkpoints" / "last.ckpt").exists(), "the job's first checkpoint", 300)
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], env=cluster.env, check=True)  # --signal=B:USR1
    wait_for(lambda: (run_dir / "summary.json").exists(), "the interrupted summary", 120)
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
    start_requeued(cluster, job)
    wait_for(lambda: job_field(cluster, job, "JobState") in ("COMPLETED", "FAILED", "CANCELLED"),
             "the requeued job to end", 600)
    log = (tmp_path / f"mhalab-{job}.log").read_text()
    assert job_field(cluster, job, "JobState") == "COMPLETED", log[-3000:] + what_slurm_said(cluster, job)
    assert "resuming from" in log and "stopped by SIGUSR1" in log  # one log, appended to by both starts
    got = json.loads((run_dir / "summary.json").read_text())
    assert got["status"] == "ok" and got["environment"]["torch_threads"] == 2  # --cpus-per-task=2
    assert results(got) == results(reference(tmp_path_factory, data_cache, 2, "seed=0"))
