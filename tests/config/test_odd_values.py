"""Odd values (issue 24, "Trust boundaries"): each is refused before anything is written, in one sentence naming the
key and what is allowed (`mhalab.checks`, `mhalab.config.schema`, `mhalab.config.writes`, `mhalab.runs.preflight`),
in this process and as a real `mhalab train` command (exit 2, no run directory)."""

import os
import subprocess
import sys

import pytest

from conftest import TINY, refusal
from mhalab.checks import INT64_MAX, NAME_MAX, available_cpus, check_int, check_name, check_path
from mhalab.errors import ConfigError

CPUS = available_cpus()
LONG = "a" * (NAME_MAX + 45)  # 300 bytes: one file name too many
HUGE = 10**20  # beyond int64

# (overrides, multirun, what the sentence says)
ODD = [
    ([f"task_name={LONG}"], False, "task_name='aaaa"),
    ([f"task_name='{'é' * 128}'"], False, "(it has 256 bytes)"),  # 128 characters, 256 bytes (quoted for Hydra)
    ([f"data.num_workers={CPUS + 1}"], False, f"num_workers must be an integer in [0, {CPUS}], the CPUs"),
    (["data.num_workers=100000"], False, "data.num_workers=100000"),
    ([f"trainer.max_epochs={HUGE}"], False, "max_epochs must be an integer in [1, 2**63 - 1]"),
    ([f"trainer.max_steps={INT64_MAX + 1}"], False, "max_steps must be an integer in [1, 2**63 - 1]"),
    (["trainer.max_epochs=1e20"], False, "trainer.max_epochs"),  # a float where a count is expected
    ([f"trainer.limit_train_batches={HUGE}"], False, "count of batches in [1, 2**63 - 1]"),
    ([f"trainer.devices={HUGE}"], False, "trainer.devices="),
    ([f"checkpoint.every_n_steps={HUGE}"], False, "every_n_steps must be an integer in [1, 2**63 - 1]"),
    (["checkpoint.monitor=val/foo"], False, "monitor must be one of val/loss, val/acc, val/acc_best"),
    (["checkpoint.monitor=val/acc"], False, "so mode must be max"),  # mode min: the worst would be kept
    (["checkpoint.mode=max"], False, "so mode must be min"),
    (["checkpoint.monitor=val/bpb", "checkpoint.mode=min"], False, "reports no bits per byte"),
    (["optimized_metric=val/bpb"], False, "optimized_metric=val/bpb: task bbc_news"),
    (["endpoint.metric=val/foo"], False, "endpoint.metric='val/foo'"),
    (["endpoint.metric=val/acc_best"], False, "recorded at every validation (val/loss, val/acc, val/bpb)"),
    (["tags=[{a:1}]"], False, "tags[0]={'a': 1}: each tag must be a string of 1 to 64 characters"),
    (["tags=[[a,b]]"], False, "tags[0]=['a', 'b']"),
    ([f"tags=[{'t' * 65}]"], False, "tags[0]='ttt"),
    ([f"logger.csv.name={LONG}"], False, "logger.csv.name='aaa"),
    (["logger.csv.version=a/b"], False, "logger.csv.version='a/b': version becomes a file or folder name"),
    (["logger=wandb", "logger.wandb.id=x/y"], False, "logger.wandb.id='x/y'"),
    ([f"hydra.job.name={LONG}"], False, "hydra.job_logging.handlers.file.filename="),
    ([f"hydra.run.dir=out/{LONG}"], False, "hydra.run.dir="),
    (["hydra/launcher=parallel", "hydra.launcher.n_jobs=100000", "seed=0,1"], True,
     f"n_jobs (worker processes) must be -1 (one per CPU) or an integer in [1, {CPUS}]"),
    (["hydra/launcher=parallel", "hydra.launcher.n_jobs=0", "seed=0,1"], True, "hydra.launcher.n_jobs=0"),
    ([f"hydra.sweep.dir=out/{LONG}", "seed=0,1"], True, "hydra.sweep.dir="),
    (["hydra.sweeper.max_batch_size=0", "seed=0,1"], True, "hydra.sweeper.max_batch_size=0: give null or -1"),
    (["hydra.sweeper.max_batch_size=-2", "seed=0,1"], True, "hydra.sweeper.max_batch_size=-2"),
    (["trainer.accelerator=cpu", f"trainer.devices={CPUS + 1}"], False, "devices (one process each) must be"),
]


@pytest.mark.parametrize("overrides, multirun, says", ODD, ids=[" ".join(o)[:60] for o, _, _ in ODD])
def test_an_odd_value_is_one_sentence_before_anything_is_written(train, tmp_path, overrides, multirun, says):
    r = train(*overrides, multirun=multirun)
    assert says in refusal(r), r.stderr[-2000:]
    assert not (tmp_path / "logs").exists() and not (tmp_path / "out").exists()


# a real `mhalab train`: exit 2, one sentence on stderr and no run directory
COMMANDS = [
    ([f"task_name={LONG}"], "task_name="),
    (["data.num_workers=100000"], "data.num_workers=100000"),
    ([f"trainer.max_epochs={HUGE}"], f"trainer.max_epochs={HUGE}"),
    (["checkpoint.monitor=val/foo"], "checkpoint.monitor='val/foo'"),
    (["tags=[{a:1}]"], "tags[0]="),
    (["logger.csv.version=a/b"], "logger.csv.version='a/b'"),
]


@pytest.mark.proc
@pytest.mark.parametrize("overrides, says", COMMANDS, ids=[o[0][:40] for o, _ in COMMANDS])
def test_mhalab_train_refuses_an_odd_value_with_exit_2(tmp_path, data_cache, overrides, says):
    env = {**os.environ, "WANDB_SILENT": "true"}
    env.pop("MHALAB_ALLOW", None)
    r = subprocess.run([sys.executable, "-m", "mhalab", "train", *TINY, f"paths.root_dir={tmp_path}",
                        f"data.cache_dir={data_cache}", *overrides], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert says in refusal(r), r.stderr[-2000:]
    assert not (tmp_path / "logs").exists()


def test_values_at_the_limits_are_accepted(tmp_path, data_cache):
    from mhalab.runs.preflight import preflight

    plan = preflight([*TINY, f"paths.root_dir={tmp_path}", f"data.cache_dir={data_cache}", f"task_name={'t' * 200}",
                      f"data.num_workers={CPUS}", f"trainer.max_steps={INT64_MAX}", "checkpoint.monitor=val/acc",
                      "checkpoint.mode=max", f"tags=[{'t' * 64},x]", "endpoint.metric=val/loss"])
    (_, tc), = plan.jobs
    assert (tc.task_name, tc.data.num_workers, tc.trainer.max_steps, tc.tags) == ("t" * 200, CPUS, INT64_MAX,
                                                                                 ["t" * 64, "x"])
    plan = preflight(["-m", *TINY, f"paths.root_dir={tmp_path}", f"data.cache_dir={data_cache}", "seed=0,1",
                      "hydra/launcher=parallel", "hydra.launcher.n_jobs=-1", "data=bbc_news_lm",
                      "checkpoint.monitor=val/bpb", "optimized_metric=val/bpb"])
    assert [tc.checkpoint.monitor for _, tc in plan.jobs] == ["val/bpb", "val/bpb"]  # a text LM logs bpb


def test_check_int_holds_every_count_within_int64():
    assert check_int("trainer.max_steps", INT64_MAX, 1) == INT64_MAX
    for value in (INT64_MAX + 1, HUGE):
        with pytest.raises(ConfigError, match=rf"^trainer\.max_steps={value}: max_steps must be an integer in "
                                              r"\[1, 2\*\*63 - 1\]$"):
            check_int("trainer.max_steps", value, 1)
    with pytest.raises(ConfigError, match=r"x=-\d+: x must be an integer >= -\(2\*\*63 - 1\)$"):
        check_int("x", -HUGE)
    with pytest.raises(ConfigError, match=r"must be an integer in \[1, 3\]$"):
        check_int("x", HUGE, 1, 3)  # an explicit bound is the one named


@pytest.mark.parametrize("value", ["", ".", "..", "a/b", "a\0b", "x" * 256, "é" * 128, {"a": 1}, None, True])
def test_check_name_refuses_what_is_not_one_file_name(value):
    with pytest.raises(ConfigError, match=r"^logger\.csv\.name=.*: name becomes a file or folder name, so it must be "
                                          r"1 to 255 bytes without '/' or NUL"):
        check_name("logger.csv.name", value)


def test_check_name_and_check_path_accept_what_fits():
    assert check_name("task_name", "x" * 255) == "x" * 255 and check_name("logger.tb.version", 3) == "3"
    assert check_path("paths.log_dir", "/tmp/" + "x" * 255 + "/y") == "/tmp/" + "x" * 255 + "/y"


@pytest.mark.parametrize("path, says", [("/tmp/" + "x" * 256, "has 256 bytes"), ("/tmp/a\0b", "NUL"),
                                        ("a/" * 2100, "it has 4200 bytes")])
def test_check_path_refuses_what_the_file_system_cannot_hold(path, says):
    with pytest.raises(ConfigError, match=r"^paths\.log_dir=.*: a path may not contain NUL") as e:
        check_path("paths.log_dir", path)
    assert says in str(e.value)
