"""Fault injection: crashes, resume, determinism, NaN, bad inputs, unsafe files, full disks."""

import json
import os
import pickle
import resource
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import summaries

from mhalab.errors import ConfigError

# three short epochs of MLM (dropout and random masking on), stats every 2 steps
EPOCHS = ["data=bbc_news_mlm", "trainer.max_epochs=3", "trainer.limit_train_batches=4",
          "trainer.log_every_n_steps=1"]


def results(summary: dict) -> dict:
    return {k: summary[k] for k in ("metrics", "test_metrics", "head_stats", "head_importance")}


def differences(a: dict, b: dict) -> dict:
    """{section/key: (a, b)} wherever two results() differ."""
    return {f"{sec}/{k}": (a[sec].get(k), b[sec].get(k)) for sec in a for k in set(a[sec]) | set(b[sec])
            if a[sec].get(k) != b[sec].get(k)}


def test_sigkill_mid_epoch_then_resume_gives_the_uninterrupted_metrics(run_train, tmp_path):
    # the reference: never interrupted, in its own root
    ref_root = tmp_path / "reference"
    ref_root.mkdir()
    ref = run_train(*EPOCHS, env={"MHALAB_ROOT": str(ref_root)})
    assert ref.returncode == 0, ref.stderr[-3000:]
    (expected,) = summaries(ref_root / "logs")

    killed = run_train(*EPOCHS, "fault.kill_at_step=6")  # SIGKILL in the middle of the second epoch
    assert killed.returncode == -signal.SIGKILL
    (run_dir,) = (tmp_path / "logs" / "train" / "runs").iterdir()
    assert (run_dir / "checkpoints" / "last.ckpt").is_file() and not (run_dir / "summary.json").exists()
    torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)  # whole, loadable

    resumed = run_train(*EPOCHS, "resume=true")  # the same command, plus resume=true
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout + resumed.stderr
    assert [p.name for p in (tmp_path / "logs" / "train" / "runs").iterdir()] == [run_dir.name]  # same directory
    (got,) = summaries(tmp_path / "logs")
    assert got["timings"]["train_steps"] == expected["timings"]["train_steps"] == 12
    assert not differences(results(got), results(expected))  # exactly, not approximately
    assert (run_dir / "csv" / "metrics.csv").exists() and (run_dir / "csv" / "resumed-1" / "metrics.csv").exists()


def test_same_command_twice_gives_identical_summary_metrics(run_train, tmp_path):
    roots = [tmp_path / "a", tmp_path / "b"]
    for root in roots:
        root.mkdir()
        r = run_train("data=bbc_news_mlm", env={"MHALAB_ROOT": str(root)})
        assert r.returncode == 0, r.stderr[-3000:]
    (a,), (b,) = (summaries(root / "logs") for root in roots)
    assert not differences(results(a), results(b))


def test_resume_without_a_matching_run_says_so(run_train, tmp_path):
    r = run_train("resume=true")
    assert r.returncode == 2 and "resume=true: no run under" in r.stderr
    assert not (tmp_path / "logs" / "train" / "runs").exists() or not any((tmp_path / "logs" / "train" / "runs").iterdir())


def test_nan_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(run_train, tmp_path):
    r = run_train("trainer.max_epochs=3", "trainer.limit_train_batches=4", "fault.nan_at_step=6")
    assert r.returncode == 1
    assert "loss is nan at step 6" in r.stderr
    (run_dir,) = (tmp_path / "logs" / "train" / "runs").iterdir()
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 4 and all(torch.isfinite(v).all() for v in ckpt["state_dict"].values()
                                            if v.is_floating_point())
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["status"] == "failed" and s["kind"] == "nan"


def test_multirun_keeps_going_past_a_nan_job_and_a_bad_config(run_train, tmp_path):
    r = run_train("fault.nan_at_step=null,2", "attention.n_kv_heads=null,3", "stats=off", multirun=True)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = summaries(tmp_path / "logs")
    status = sorted((s.get("kind", "ok"), s["status"]) for s in runs)
    assert status == [("config", "failed"), ("config", "failed"), ("nan", "failed"), ("ok", "ok")]


@pytest.mark.parametrize("content,message", [
    (None, "does not exist"),
    (b"", "empty"),
    (b"text,label\n\xff\xfe caf\xe9,1\n", "UTF-8"),
    (b"text,label\nsome words,1\nmore words,9\n", "label"),
])
def test_bad_local_data_file_fails_before_training(run_train, tmp_path, content, message):
    path = tmp_path / "data.csv"
    if content is not None:
        path.write_bytes(content)
    r = run_train(f"data.path={path}", "data.limit=null")
    assert r.returncode == 2, r.stderr[-2000:]
    assert message in r.stderr and str(path.name) in r.stderr
    assert "Traceback" not in r.stderr
    assert not list((tmp_path / "logs").rglob("*/runs/*"))


def test_unknown_config_key_fails_before_any_run_directory(run_train, tmp_path):
    r = run_train("attention.n_head=4")
    assert r.returncode == 2 and "attention.n_head" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "logs").exists()


def test_unwritable_log_dir_is_one_clear_error(run_train, tmp_path):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where a directory should be")
    r = run_train(f"paths.log_dir={blocked}/logs")
    assert r.returncode == 2 and "paths.log_dir=" in r.stderr and "not writable" in r.stderr
    assert "Traceback" not in r.stderr


def test_disk_full_while_writing_checkpoints_is_one_clear_error(run_train, tmp_path, data_cache):
    warm = run_train("train=false", "test=false", "stats=off")  # fill the data cache first, without the limit
    assert warm.returncode == 0, warm.stderr[-2000:]
    env = {**os.environ, "MHALAB_ROOT": str(tmp_path)}
    from conftest import TINY

    limit = 200_000  # bytes per file: the data cache and logs fit, a checkpoint does not

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    r = subprocess.run([sys.executable, "-m", "mhalab.train", *TINY, f"data.cache_dir={data_cache}",
                        "model.d_model=64", "model.d_ff=256", "stats=off"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, preexec_fn=small_files, timeout=300)
    assert r.returncode == 1
    assert "error: could not write" in r.stderr and "File too large" in r.stderr
    assert "Traceback" not in r.stderr


class Boom:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_checkpoint_with_pickled_code_is_refused_and_never_runs(tmp_path, monkeypatch):
    from mhalab.checkpoint import load_checkpoint

    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "evil.ckpt"
    with open(bad, "wb") as f:
        pickle.dump({"state_dict": {}, "hyper_parameters": Boom()}, f)
    with pytest.raises(ConfigError, match="cannot be loaded safely"):
        load_checkpoint(bad)
    assert not (tmp_path / "PWNED").exists()
    with pytest.raises(ConfigError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.ckpt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.ckpt")
    with pytest.raises(ConfigError, match="not an mhalab training checkpoint"):
        load_checkpoint(tmp_path / "other.ckpt")


def test_checkpoint_of_another_architecture_is_refused(run_train, tmp_path):
    from mhalab.checkpoint import load_module

    r = run_train("stats=off", "test=false")
    assert r.returncode == 0, r.stderr[-2000:]
    (ckpt,) = (tmp_path / "logs").rglob("last.ckpt")
    assert load_module(ckpt, expect={"n_heads": 2}).model_cfg.n_heads == 2
    with pytest.raises(ConfigError, match="n_heads=2, expected 8"):
        load_module(ckpt, expect={"n_heads": 8})
    state = torch.load(ckpt, weights_only=True)
    state["hyper_parameters"]["model_cfg"]["d_ff"] = 128  # weights no longer fit
    torch.save(state, tmp_path / "mismatch.ckpt")
    with pytest.raises(ConfigError, match="do not fit"):
        load_module(tmp_path / "mismatch.ckpt")


def test_atomic_checkpoint_survives_sigkill_at_any_moment(tmp_path):
    """Kill a process that rewrites last.ckpt in a loop at varied moments: what is left always loads whole."""
    target = tmp_path / "last.ckpt"
    code = ("import sys, torch; from mhalab.runs import AtomicCheckpointIO; io = AtomicCheckpointIO()\n"
            "i = 0\nwhile True:\n"
            "    io.save_checkpoint({'step': i, 'w': torch.full((2_000_000,), float(i))}, sys.argv[1])\n"
            "    print(i, flush=True); i += 1\n")
    for delay in (0.0, 0.05, 0.13):
        p = subprocess.Popen([sys.executable, "-c", code, str(target)], stdout=subprocess.PIPE, text=True)
        p.stdout.readline()  # one save done: the loop is now rewriting the file
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
        ckpt = torch.load(target, weights_only=True)  # (a killed writer may leave its .tmp file, never a bad target)
        assert ckpt["w"].shape == (2_000_000,) and torch.all(ckpt["w"] == ckpt["step"])


def test_resume_continues_the_same_wandb_run(run_train, tmp_path):
    killed = run_train(*EPOCHS, "logger=wandb", "stats=off", "fault.kill_at_step=6")
    assert killed.returncode == -signal.SIGKILL
    resumed = run_train(*EPOCHS, "logger=wandb", "stats=off", "resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (run_dir,) = (tmp_path / "logs" / "train" / "runs").iterdir()
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 2  # one per process, both offline
    assert len({r.name.rsplit("-", 1)[-1] for r in runs}) == 1  # the same run id
