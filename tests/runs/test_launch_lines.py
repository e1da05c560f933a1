"""A parallel sweep (hydra/launcher=parallel) announces each job as it starts, not all of them up front (issue 28):
stopped by a signal, it has printed one launch line for each job that began and none for a job it did not start.
Tried on a real `mhalab train -m` process and a real SIGINT to its process group (Ctrl-C)."""

import os
import re
import signal
import subprocess
import sys

import pytest

from conftest import TINY, proc_env, wait_for
from test_stopping import RUN

MHALAB = [sys.executable, "-m", "mhalab"]
LAUNCH = re.compile(r"#(\d+) : (.*)$")


@pytest.mark.proc  # a real parallel sweep, stopped by a signal
@pytest.mark.slow  # in the default suite, a basic sweep's launch lines when stopped: test_console's test_a_stopped_sweep_announces_no_job_it_does_not_start
def test_a_stopped_parallel_sweep_prints_a_launch_line_per_started_job_only(tmp_path, data_cache):
    args = ["-m", "hydra/launcher=parallel", *TINY, *RUN, f"paths.root_dir={tmp_path}", f"data.cache_dir={data_cache}",
            "trainer.max_epochs=100", "trainer.limit_train_batches=4", "seed=0,1,2"]
    proc = subprocess.Popen([*MHALAB, "train", *args], cwd=tmp_path, env={**proc_env(), "PYTHONUNBUFFERED": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    multiruns = tmp_path / "logs" / "train" / "multiruns"
    try:
        wait_for(lambda: len(list(multiruns.glob("*/*/checkpoints/last.ckpt"))) == 2, "both running jobs' checkpoints")
        os.killpg(proc.pid, signal.SIGINT)
        out = proc.communicate(timeout=240)[0]
    finally:
        proc.kill()
    assert proc.returncode == 130, out[-3000:]
    (sweep,) = multiruns.iterdir()
    started = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert started == ["0", "1"], started  # job 2 never started
    launched = [m.groups() for m in map(LAUNCH.search, out.splitlines()) if m]
    assert sorted(num for num, _ in launched) == started, out[-3000:]  # one line per started job, none for job 2
    for num, overrides in launched:
        assert f"seed={num}" in overrides.split(), overrides
        assert "hydra." not in overrides  # the launcher's own filter: task overrides only
    # the job says it from its own log too: its train.log has its launch line
    for num in started:
        assert LAUNCH.search((sweep / num / "train.log").read_text().splitlines()[0]), num
