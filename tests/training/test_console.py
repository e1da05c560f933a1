"""What a run prints while it works (issue 28): a line at least every `heartbeat_s` in every phase, an ETA that
does not swing, the closing validation, a stop during the end-of-run extras that leaves a resumable run, a stopped
sweep that announces no job it does not start, and the hint to resume an unfinished twin. Signals and the console
are tried on real `mhalab` processes."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TINY, refusal
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


@pytest.mark.proc
@pytest.mark.slow
def test_every_phase_prints_and_the_closing_validation_is_shown(run_train):
    """Validation, test and each extra begin with a line and, while they last, print one every heartbeat_s; the
    final line's val/loss is the last one printed (the closing validation, after 2 steps of 3, is printed)."""
    r = run_train("trainer.max_steps=2", "stats.plots=true", "callbacks.progress_log.heartbeat_s=0.2")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for start in ("validation (closing) at step 2: started (2 batches)", "test: started (2 batches)",
                  "end of run: importance: started (2 batches)",
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


@pytest.mark.proc
@pytest.mark.slow
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


@pytest.mark.proc
@pytest.mark.slow
def test_rerunning_an_interrupted_command_names_the_unfinished_run_and_its_resume(tmp_path, data_cache):
    """The same command again, after a Ctrl-C: before its run starts it names the unfinished twin and the command
    that continues it; that command resumes the twin to the end."""
    args = [*TINY, f"data.cache_dir={data_cache}", "stats.enabled=false", "trainer.max_epochs=4"]
    env = {**os.environ, "MHALAB_ROOT": str(tmp_path), "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([*MHALAB, "train", *args], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    out = []
    for line in p.stdout:
        out.append(line)
        if re.search(r"\] - step 1/", line):
            p.send_signal(signal.SIGINT)
            break
    out.append(p.communicate(timeout=60)[0])
    assert p.returncode == 130, "".join(out)
    twin = run_dir_of("".join(out))

    again = subprocess.Popen([*MHALAB, "train", *args], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        hint = [again.stderr.readline(), again.stderr.readline()]
    finally:
        again.kill()
        again.communicate()
    assert hint[0].startswith(f"mhalab: an unfinished run of this config exists (interrupted): {twin}; "), hint
    command = shlex.split(hint[1])
    assert command[:2] == ["mhalab", "train"] and command[-1] == f"resume={twin}"

    r = subprocess.run([*MHALAB, *command[1:-1], "trainer.max_epochs=1", f"resume={twin}"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "other values of trainer.max_epochs" in r.stderr  # it is that run's own command
    r = subprocess.run([*MHALAB, *command[1:]], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and f"resuming from {twin}" in r.stdout, r.stdout + r.stderr
    assert summary(twin)["status"] == "ok"


@pytest.mark.proc
def test_a_stopped_sweep_announces_no_job_it_does_not_start(tmp_path, data_cache):
    """Ctrl-C (to the process group) during job 0 of three: Hydra's line for job 0 is there, none for 1 and 2."""
    args = ["-m", *TINY, f"data.cache_dir={data_cache}", "stats.enabled=false", "trainer.max_epochs=200",
            "seed=0,1,2"]
    env = {**os.environ, "MHALAB_ROOT": str(tmp_path), "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([*MHALAB, "train", *args], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out = []
    try:
        for line in p.stdout:
            out.append(line)
            if re.search(r"\] - step 1/", line):
                os.killpg(p.pid, signal.SIGINT)
                break
        out.append(p.communicate(timeout=120)[0])
    finally:
        p.kill()
    text = "".join(out)
    assert p.returncode == 130, text
    assert re.search(r"#0 : .*seed=0", text) and "the sweep stopped (SIGINT)" in text
    assert not re.search(r"#[12] : ", text), text


def test_a_mistyped_key_gets_a_did_you_mean_before_hydras_append_hint(train):
    r = train("attention.n_head=4")
    assert r.returncode == 2
    assert r.stderr.strip() == ("error: attention.n_head is not a key of attention; did you mean n_heads? keys of "
                                "attention are n_heads, n_kv_heads, d_head, backend, dropout (mhalab/config/schema.py)")
    r = train("trainer.val_check_intervall=2")
    assert r.returncode == 2 and "did you mean val_check_interval?" in r.stderr and "+trainer" not in r.stderr
    r = train("callbacks.progress_log.every_n_step=2")  # a node of free keys: adding one with + is allowed
    assert r.returncode == 2 and r.stderr.strip().endswith(
        "did you mean every_n_steps? keys of callbacks.progress_log are _target_, every_n_steps, heartbeat_s; "
        "+callbacks.progress_log.every_n_step=VALUE adds it as a new key")


def test_trainer_settings_are_checked_against_the_batches_of_the_data():
    """TrainerConfig.check_sizes: what Lightning refuses with a traceback is one sentence; what leaves no number
    is a warning; a setting that fits passes."""
    from mhalab.config.schema import TrainerConfig
    from mhalab.errors import ConfigError

    n = {"train": 10, "val": 4, "test": 4}
    assert TrainerConfig(val_check_interval=10, max_steps=30).check_sizes(n) == []
    with pytest.raises(ConfigError, match=r"^trainer.val_check_interval=11 is more than the 10 training batches"):
        TrainerConfig(val_check_interval=11).check_sizes(n)
    with pytest.raises(ConfigError, match=r"more than the 5 training batches of an epoch \(with "
                                          r"trainer.limit_train_batches=5\)"):
        TrainerConfig(val_check_interval=6, limit_train_batches=5).check_sizes(n)
    assert TrainerConfig(val_check_interval=11, check_val_every_n_epoch=None, max_steps=30).check_sizes(n) == []
    for key in ("limit_train_batches", "limit_val_batches", "limit_test_batches"):
        with pytest.raises(ConfigError, match=rf"^trainer.{key}=0.1 gives 0 of the"):
            TrainerConfig(**{key: 0.1}).check_sizes({"train": 9, "val": 9, "test": 9})
    (warning,) = TrainerConfig(max_epochs=1, log_every_n_steps=50).check_sizes(n)
    assert warning.startswith("trainer.log_every_n_steps=50 is more than the run's 10 optimizer steps")
    (warning,) = TrainerConfig(check_val_every_n_epoch=2, max_steps=15).check_sizes(n)
    assert warning.startswith("trainer.check_val_every_n_epoch=2 with trainer.max_steps=15: training ends before")


@pytest.mark.proc
@pytest.mark.slow
def test_val_check_interval_beyond_an_epoch_is_one_sentence_and_no_run_directory(run_train, tmp_path):
    r = run_train("trainer.val_check_interval=50")
    assert refusal(r) == (
        "error: trainer.val_check_interval=50 is more than the 3 training batches of an epoch (with "
        "trainer.limit_train_batches=3); give a count <= 3, a fraction of an epoch in (0, 1], or "
        "trainer.check_val_every_n_epoch=null to count batches across epochs")
    assert not list((tmp_path / "logs").rglob("summary.json")) and not list((tmp_path / "logs").rglob(".hydra"))


@pytest.mark.proc
@pytest.mark.slow
def test_debug_fast_is_one_validation_statistics_once_and_a_shared_data_cache(tmp_path, monkeypatch, run_train,
                                                                              data_cache):
    from mhalab.runs.preflight import compose

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    for folder in ("a", "b"):  # wherever the command starts, the same cache
        monkeypatch.setenv("MHALAB_ROOT", str(tmp_path / folder))
        assert compose(["debug=fast"]).paths.cache_dir == str(tmp_path / "home" / ".cache" / "mhalab")
    assert compose(["debug=fast", "paths.cache_dir=/elsewhere"]).data.cache_dir == "/elsewhere"

    r = run_train("debug=fast", f"data.cache_dir={data_cache}", tiny=False)
    assert r.returncode == 0, r.stderr
    assert re.findall(r"validation(?: \(closing\))? at step (\d+): started", r.stdout) == ["4"]
    assert "end of run: statistics" not in r.stdout  # measured at that validation, on the same weights
    assert "end of run: importance: started" in r.stdout and "mhalab: done" in r.stdout
