"""What a run prints while it works (issue 28): a line at least every `heartbeat_s` in every phase, an ETA that
does not swing, the closing validation, a stop during the end-of-run extras that leaves a resumable run, a stopped
sweep that announces no job it does not start, and the hint to resume an unfinished twin. Signals and the console
are tried on real `mhalab` processes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TINY
from mhalab.training.console import StepEta

MHALAB = [sys.executable, "-m", "mhalab"]
VAL_LINE = re.compile(r"\] - step (\d+) \| (.*val/loss [0-9.]+.*)$")


def popen(tmp_path: Path, data_cache: Path, *overrides: str) -> subprocess.Popen:
    env = {**os.environ, "MHALAB_ROOT": str(tmp_path), "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}
    env.pop("MHALAB_RUN_ID", None)
    return subprocess.Popen([*MHALAB, "train", *TINY, f"data.cache_dir={data_cache}", *overrides], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def run_dir_of(output: str) -> Path:
    return Path(re.search(r"run directory (\S+)", output).group(1))


def test_every_phase_prints_and_the_closing_validation_is_shown(run_train):
    """Validation, test and each extra begin with a line and, while they last, print one every heartbeat_s; the
    final line's val/loss is the last one printed (the closing validation, after 2 steps of 3, is printed)."""
    r = run_train("trainer.max_steps=2", "stats.plots=true", "callbacks.progress_log.heartbeat_s=0.2")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for start in ("validation (closing) at step 2: started (2 batches)", "test: started (2 batches)",
                  "end of run: statistics: started", "end of run: importance: started (2 batches)",
                  "end of run: plots: started"):
        assert start in out, start
    # drawing takes seconds: the heartbeat speaks during it, with the time so far and an ETA field
    assert re.search(r"end of run: plots: \d+ s so far \| ETA ", out)
    printed = [m.group(2) for m in map(VAL_LINE.search, out.splitlines()) if m]
    last_loss = re.search(r"val/loss ([0-9.]+)", printed[-1]).group(1)
    final = re.search(r"mhalab: done .*val/loss ([0-9.]+)", out).group(1)
    assert last_loss == final
    assert "ERROR" not in out + r.stderr


def test_eta_from_recent_steps_does_not_swing():
    """A slow step (10x) or a validation moves the ETA by a fraction; validation's share of the time is counted."""
    eta = StepEta(window=20)
    t = 0.0
    eta.step(t, 0)
    for _ in range(30):
        t += 1.0
        eta.step(t)
    assert eta.eta(100) == pytest.approx(100.0)
    t += 10.0  # one slow step
    eta.step(t)
    assert 100.0 < eta.eta(100) < 160.0
    eta.paused(50.0)  # a validation: not a step
    t += 50.0 + 1.0
    eta.step(t)
    assert eta.steps[-1] == pytest.approx(1.0)
    assert eta.eta(100) == pytest.approx(100 * sum(eta.steps) / len(eta.steps) * (1 + 50.0 / eta.train_s))
    assert StepEta().eta(10) != StepEta().eta(10)  # no step yet: unknown (nan), never a made-up number


def test_ctrl_c_during_extras_stops_at_once_and_resume_computes_them(tmp_path, data_cache):
    """SIGINT as the end-of-run importance starts: exit 130 within seconds, an "interrupted" summary, no ERROR;
    `resume=<dir>` then computes importance and pictures without training again, with the same metrics."""
    p = popen(tmp_path, data_cache, "stats.plots=true", "stats.importance_batches=4")
    lines = []
    try:
        for line in p.stdout:
            lines.append(line)
            if "end of run: importance: started" in line:
                t_signal = time.monotonic()
                p.send_signal(signal.SIGINT)
                break
        else:
            pytest.fail("the importance never started:\n" + "".join(lines))
        rest, _ = p.communicate(timeout=60)
        waited = time.monotonic() - t_signal
    finally:
        p.kill()
    out = "".join(lines) + rest
    assert p.returncode == 130, out
    assert waited < 10, waited
    assert "ERROR" not in out and "plots: started" not in out
    run_dir = run_dir_of(out)
    stopped = summary(run_dir)
    assert stopped["status"] == "interrupted" and stopped["head_importance"] is None
    assert f"resume={run_dir}" in out

    env = {**os.environ, "MHALAB_ROOT": str(tmp_path), "WANDB_SILENT": "true"}
    r = subprocess.run([*MHALAB, "train", *TINY, f"data.cache_dir={data_cache}", "stats.plots=true",
                        "stats.importance_batches=4", f"resume={run_dir}"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    done = summary(run_dir)
    assert done["status"] == "ok"
    assert done["head_importance"] is not None and len(done["head_importance"]) == 1
    assert done["plots"] and all((run_dir / p).is_file() for p in done["plots"])
    assert done["metrics"] == stopped["metrics"]
    assert done["timings"]["train_steps"] == stopped["timings"]["train_steps"] == 3
    assert not re.search(r"\] - step \d+/", r.stdout)  # no training step ran again
