"""End-to-end `mhalab train`: each offline task, loggers, the run contract, multiruns, DDP, own files and tasks,
console output. Runs in this process where nothing needs a process of its own (fast), else in a subprocess."""

import csv
import shutil
import sys
from pathlib import Path

import pytest
from conftest import refusal, summaries

from mhalab.head_statistics import DETECTOR_NAMES, STAT_NAMES
from mhalab.runs.summary import read_summary


def only_run(root: Path) -> Path:
    (run_dir,) = (root / "logs" / "train" / "runs").iterdir()
    return run_dir


def test_bbc_news_run_writes_the_run_contract_stats_plots_and_every_logger(train, tmp_path):
    r = train("logger=many", "stats.plots=true")
    assert r.returncode == 0, r.stderr[-3000:]
    run_dir = only_run(tmp_path)
    s = read_summary(run_dir)  # the contract's own reader accepts it
    assert r.stdout.strip().splitlines()[-1].endswith(f"results in {run_dir}/summary.json; pictures in {run_dir}/plots")
    assert s.status == "ok" and s.task == "bbc_news" and s.schema_version == 1
    assert {"val/loss", "val/acc", "val/acc_best", "train/loss"} <= set(s.metrics)
    assert {"test/loss", "test/acc"} <= set(s.test_metrics)
    assert s.architecture["attention"] == {"n_heads": 2, "n_kv_heads": 2, "d_head": 16, "backend": "sdpa",
                                           "dropout": 0.0}  # resolved, not re-derived by readers
    assert s.label_names == ["business", "entertainment", "politics", "sports", "tech"]
    assert s.cost["kv_cache_bytes_per_token"] == 2 * 2 * 16 * 4 and s.timings["train_steps"] == 3
    assert s.baselines["chance_acc"] == 0.2 and 0 < s.baselines["majority_acc"] < 1
    assert set(s.head_stats) == set(STAT_NAMES + DETECTOR_NAMES)
    assert s.head_stats["entropy"] and len(s.head_stats["entropy"][0]) == 2
    assert len(s.head_importance) == 1 and len(s.head_importance[0]) == 2
    # paths are relative to the run directory: a copied run directory is self-contained
    assert not Path(s.checkpoints["last"]).is_absolute() and (run_dir / s.checkpoints["last"]).is_file()
    assert all(not Path(p).is_absolute() and (run_dir / p).stat().st_size > 0 for p in s.plots)
    assert (run_dir / "plots" / "attention_maps.png").exists() and (run_dir / "plots" / "stat_importance.png").exists()
    with open(run_dir / "csv" / "metrics.csv") as f:
        header = next(csv.reader(f))
    assert "attn/L0H1/entropy" in header and "attn/L0/entropy_mean" in header and "val/acc" in header
    events = list((run_dir / "tensorboard").rglob("events.out.tfevents.*"))
    assert events and b"attn/attention_maps" in b"".join(e.read_bytes() for e in events)  # pictures as images
    assert list((run_dir / "wandb").glob("offline-run-*/*.wandb"))
    assert (run_dir / ".hydra" / "config.yaml").is_file()  # the full config is in the run directory
    log = (run_dir / "train.log").read_text()
    assert "mhalab: task bbc_news" in log and "val/acc" in log and "results in" in log


def test_console_is_short_and_quiet(train):
    r = train("logger=many")
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    for noise in ("litlogger", "anonymous setting", "Images sizes do not match", "Total FLOPs", "LeafSpec",
                  "GPU available", "weights_only` was not set", "sparkline", "Run summary", "Run history"):
        assert noise not in out, noise
    assert "mhalab: task bbc_news (classification, 5 classes)" in out and "M parameters" in out
    assert len(out.strip().splitlines()) < 25, out


def test_mlm_run_reports_bits_per_byte_and_the_unigram_level(train, tmp_path):
    r = train("data=bbc_news_mlm")
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(only_run(tmp_path))
    assert s.objective == "mlm" and 0 < s.metrics["val/bpb"] < 20 and "test/bpb" in s.test_metrics
    assert 3 < s.baselines["unigram_bpb"] < 8


def test_mqar_run_predicts_values_at_query_positions(train, tmp_path):
    r = train("data=mqar", "data.mqar.n_train=200", "data.mqar.n_val=32", "data.mqar.n_test=32",
              "data.mqar.seq_len=32", "data.mqar.n_kv_pairs=4", "attention.n_kv_heads=1", "torch_threads=1")
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(only_run(tmp_path))
    assert s.environment["torch_threads"] == 1 and s.environment["cpu_capability"]  # what the run really used
    assert s.task == "mqar" and s.objective == "clm" and s.architecture["vocab_size"] == 64 + 5
    assert "val/bpb" not in s.metrics and 0 <= s.metrics["val/acc"] <= 1  # tokens are not text: no bits per byte
    assert s.baselines["chance_acc"] == pytest.approx(1 / 32)


def test_listops_run_with_gqa_and_rotary(train, tmp_path):
    r = train("data=listops", "attention=gqa", "attention.n_heads=4", "model.pos=rotary", "model.rotary_dim=8",
              "data.listops.n_train=256", "data.listops.n_val=32", "data.listops.n_test=32",
              "data.listops.max_length=63", "data.listops.min_length=16")
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(only_run(tmp_path))
    assert s.task == "listops" and s.architecture["attention"]["n_kv_heads"] == 2
    assert len(s.kv_groups["within_group_jsd"]) == 1


def test_a_step_cap_below_one_epoch_still_validates_and_tests_the_right_checkpoint(train, tmp_path):
    r = train("trainer.limit_train_batches=null", "trainer.max_steps=2")
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(only_run(tmp_path))
    assert s.timings["train_steps"] == 2 and "val/loss" in s.metrics and "test/acc" in s.test_metrics


def test_own_file_with_string_labels(train, tmp_path):
    rows = [("a great film, loved it", "pos"), ("dull and far too long", "neg"), ("fine, nothing more", "meh")] * 30
    path = tmp_path / "reviews.csv"
    path.write_text("text,label\n" + "".join(f'"{t}",{y}\n' for t, y in rows))
    r = train("data=ag_news", f"data.path={path}", "data.limit=null", "data.tokenizer=byte")
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(only_run(tmp_path))
    assert s.task == "file:reviews.csv" and s.label_names == ["meh", "neg", "pos"]
    assert s.architecture["n_classes"] == 3 and s.baselines["chance_acc"] == pytest.approx(1 / 3)


def test_own_task_from_a_config_folder(train, tmp_path):
    """docs/recipes.md's worked example: a task class of your own, named by _target_, allowed explicitly."""
    (tmp_path / "mytasks.py").write_text(
        "from datasets import Dataset, DatasetDict\n"
        "from mhalab.data.config import TaskInfo\n"
        "from mhalab.data.tasks import Task\n\n"
        "class Parity(Task):\n"
        "    info = TaskInfo(objective='classification', source='user', label_names=('even', 'odd'))\n\n"
        "    def __init__(self, n: int = 2000):\n"
        "        self.n = n\n\n"
        "    def load(self, cfg):\n"
        "        texts = [format(i, 'b') for i in range(self.n)]\n"
        "        return DatasetDict({'train': Dataset.from_dict({'text': texts, "
        "'label': [t.count('1') % 2 for t in texts]})})\n")
    (tmp_path / "myconf" / "data").mkdir(parents=True)
    (tmp_path / "myconf" / "data" / "parity.yaml").write_text(
        "task: parity\ntokenizer: byte\nmax_len: 16\nsource:\n  _target_: mytasks.Parity\n  n: 400\n")
    sys.path.insert(0, str(tmp_path))
    try:
        refused = train("data=parity", flags=("--config-dir", str(tmp_path / "myconf")))
        assert refused.returncode == 2 and "--allow mytasks" in refused.stderr
        r = train("data=parity", flags=("--config-dir", str(tmp_path / "myconf"), "--allow", "mytasks"))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("mytasks", None)
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(only_run(tmp_path))
    assert s.task == "parity" and s.label_names == ["even", "odd"]


def test_own_callback_granted_on_the_command_line(train, tmp_path):
    (tmp_path / "mycb.py").write_text(
        "import lightning as L\n\nclass Count(L.Callback):\n    def on_train_end(self, trainer, module):\n"
        f"        open({str(tmp_path / 'ran')!r}, 'w').write(str(trainer.global_step))\n")
    sys.path.insert(0, str(tmp_path))
    try:
        r = train("+callbacks.count={_target_:mycb.Count}", flags=("--allow", "mycb"))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("mycb", None)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "ran").read_text() == "3"


def test_multirun_gives_one_directory_and_summary_per_job(train, tmp_path):
    r = train("attention.n_heads=1,2,4", "stats=off", multirun=True)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = summaries(tmp_path / "logs")
    assert sorted(s["architecture"]["attention"]["n_heads"] for s in runs) == [1, 2, 4]


@pytest.mark.proc
@pytest.mark.slow  # the default suite runs parallel sweeps in tests/runs (stopping, launch lines)
def test_parallel_launcher_sweep_runs_every_job_in_worker_processes(run_train, tmp_path):
    """The recorded experiments' launcher, as a real process: joblib workers restore Hydra's state (the guarded
    pkg:// source among it) and each job ends ok with its own summary."""
    r = run_train("hydra/launcher=parallel", "hydra.launcher.n_jobs=2", "seed=0,1", multirun=True)
    assert r.returncode == 0, r.stderr[-3000:]
    got = summaries(tmp_path)
    assert sorted(s["config"]["seed"] for s in got) == [0, 1] and {s["status"] for s in got} == {"ok"}


def test_config_error_exits_2_with_one_sentence_and_no_run_dir(train, tmp_path):
    r = train("attention.n_heads=8", "attention.n_kv_heads=3")
    assert "attention.n_kv_heads=3 with attention.n_heads=8: n_kv_heads must divide n_heads" in refusal(r)
    assert not (tmp_path / "logs").exists()


def test_hub_task_offline_fails_fast_with_alternatives(train, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = train("data=ag_news", "data.limit=null")
    assert r.returncode == 2
    assert "ag_news" in r.stderr and "bbc_news" in r.stderr
    assert not list((tmp_path / "logs").rglob("*/runs/*"))


def test_profile_report_is_saved(train, tmp_path):
    r = train("debug=profile", "trainer.limit_train_batches=3", "trainer.limit_val_batches=2")
    assert r.returncode == 0, r.stderr[-3000:]
    (run_dir,) = (tmp_path / "logs" / "debug" / "runs").iterdir()
    assert list(run_dir.glob("*profile*.txt"))


@pytest.mark.proc
@pytest.mark.slow  # two gloo processes: 20-25 s; the default suite keeps under 4 minutes on 2 cores
def test_ddp_on_two_cpu_processes_prints_the_result_once(run_train, tmp_path):
    r = run_train("trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "stats=off")
    assert r.returncode == 0, r.stderr[-3000:]
    (s,) = summaries(tmp_path / "logs")  # written once, by rank 0
    assert s["status"] == "ok"
    assert (r.stdout + r.stderr).count("results in ") == 1


@pytest.mark.proc
@pytest.mark.slow
def test_ddp_from_the_mhalab_command_counts_every_rank(run_train, tmp_path):
    """`mhalab train trainer=ddp` (Lightning starts rank 1 as `python -m mhalab.training.train`, not as a file named "mhalab
    train"): one summary, whose tokens are those of both ranks, as many as one process with the same global batch."""
    mhalab = str(Path(sys.executable).with_name("mhalab"))
    r = run_train("trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "stats=off", "data.batch_size=8",
                  command=[mhalab, "train"])
    assert r.returncode == 0, r.stderr[-3000:]
    (ddp,) = summaries(tmp_path / "logs")
    assert ddp["status"] == "ok" and ddp["timings"]["train_steps"] == 3
    shutil.rmtree(tmp_path / "logs")
    r = run_train("stats=off", "data.batch_size=16", command=[mhalab, "train"])  # one process, the same 16 a step
    assert r.returncode == 0, r.stderr[-3000:]
    (single,) = summaries(tmp_path / "logs")
    assert ddp["timings"]["tokens_seen"] == single["timings"]["tokens_seen"] > 0


def test_output_without_a_terminal_has_progress_lines(train, tmp_path):
    r = train("trainer.max_epochs=2", "trainer.limit_train_batches=4", "callbacks.progress_log.every_n_steps=2")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [line for line in r.stdout.splitlines() if "tokens/s" in line and "ETA" in line]
    assert len(lines) >= 3, r.stdout


@pytest.mark.proc
@pytest.mark.slow
def test_default_run_learns_and_its_heads_specialise(run_train, tmp_path):
    """The README's main job, unchanged: far below the 8 bits of a uniform byte, and heads that are not uniform
    (the topic classifier's stay at normalised entropy 1.00): some first-layer head puts a fifth of its weight on
    the previous byte (0.23-0.30 measured, experiments/head_stats)."""
    r = run_train("logger=csv", tiny=False, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    (s,) = summaries(tmp_path / "logs")
    assert s["metrics"]["val/bpb"] < 3.3 and s["test_metrics"]["test/bpb"] < 3.3
    assert max(s["head_stats"]["prev"][0]) > 0.2 and min(min(r) for r in s["head_stats"]["entropy_norm"]) < 0.7
    assert "pictures in" in r.stdout and s["plots"]


def test_a_failing_extra_is_recorded_and_the_run_kept(train, tmp_path, monkeypatch):
    import mhalab.pictures

    def broken(*args, **kwargs):
        raise RuntimeError("disk of pictures on fire")

    monkeypatch.setattr(mhalab.pictures, "plot_stat_heatmaps", broken)
    r = train("stats.plots=true")
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(only_run(tmp_path))
    assert s.status == "ok" and "val/acc" in s.metrics and "test/acc" in s.test_metrics
    assert s.extras_errors == ["plots failed: RuntimeError: disk of pictures on fire"]
    assert s.head_importance is not None  # the other extras still ran


def test_optuna_keeps_its_study_in_a_sqlite_file(train, tmp_path):
    """hydra.sweeper.storage=sqlite:///<under paths.log_dir>: the study outlives the sweep (Optuna 2.10, which
    hydra-optuna-sweeper needs, writes sqlite through SQLAlchemy 1.4: pyproject pins it)."""
    import optuna

    db = tmp_path / "logs" / "study.db"
    r = train("hydra/sweeper=search", "hydra.sweeper.n_trials=2", "hydra.sweeper.study_name=lr",
              f"hydra.sweeper.storage=sqlite:///{db}", "trainer.max_steps=2", "stats=off", multirun=True)
    assert r.returncode == 0, r.stderr[-3000:]
    study = optuna.load_study(study_name="lr", storage=f"sqlite:///{db}")
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"] and len(summaries(tmp_path / "logs")) == 2


def test_optuna_maximises_the_optimized_metric(train, tmp_path, monkeypatch):
    """A search capped at max_steps (the whole epoch allowed), optimized_metric=val/acc: each trial's value is the
    run's val/acc and the study maximises it (its direction derived from the metric); a direction against the metric
    is refused in one sentence. (The study is caught as the sweeper makes it, in memory.)"""
    import optuna
    import yaml

    studies = []
    real_create_study = optuna.create_study

    def create_study(*args, **kwargs):
        studies.append(real_create_study(*args, **kwargs))
        return studies[-1]

    monkeypatch.setattr(optuna, "create_study", create_study)
    r = train("hydra/sweeper=search", "hydra.sweeper.n_trials=2", "optimized_metric=val/acc",
              "trainer.limit_train_batches=null", "trainer.max_steps=2", "stats=off", multirun=True)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = summaries(tmp_path / "logs")
    (study,) = studies
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE
    assert sorted(t.value for t in study.trials) == sorted(s["metrics"]["val/acc"] for s in runs)
    assert all(s["config"]["optimized_metric"] == "val/acc" for s in runs) and len(runs) == 2
    assert all(s["timings"]["train_steps"] == 2 and "val/loss" in s["metrics"] for s in runs)
    (results,) = (tmp_path / "logs").rglob("optimization_results.yaml")
    assert yaml.safe_load(results.read_text())["best_value"] == max(s["metrics"]["val/acc"] for s in runs)
    wrong = train("hydra/sweeper=search", "hydra.sweeper.n_trials=2", "hydra.sweeper.direction=minimize",
                  "optimized_metric=val/acc", multirun=True)
    assert wrong.returncode == 2 and len(wrong.stderr.strip().splitlines()) == 1, wrong.stderr
    assert "hydra.sweeper.direction=minimize with optimized_metric=val/acc" in wrong.stderr
    assert "must be maximize" in wrong.stderr


def test_optimized_metric_val_bpb_needs_a_text_language_model(train, tmp_path):
    r = train("optimized_metric=val/bpb")
    assert r.returncode == 2 and "optimized_metric=val/bpb: task bbc_news (classification) reports no bits" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not list(tmp_path.rglob("summary.json"))


def test_a_recipe_that_repeats_a_small_corpus_many_times_is_warned_about(train):
    r = train("trainer.max_epochs=12", "trainer.limit_train_batches=1", "stats=off")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "this run makes 12 passes over its" in r.stdout + r.stderr
