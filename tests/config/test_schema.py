"""The config schema and the preflight: every group composes, and every bad value is one sentence naming the key,
raised before anything is written (in process: composing takes a fraction of a second)."""

import pytest

from conftest import slow_except

from mhalab.errors import ConfigError
from mhalab.runs.preflight import compose, preflight, validate
from mhalab.architecture import AttentionConfig
from mhalab.config.schema import TrainConfig


@pytest.fixture
def root(tmp_path):
    """Overrides that keep everything a preflight might touch inside tmp_path."""
    return [f"paths.root_dir={tmp_path}"]


def test_default_config_composes_into_the_schema(root):
    tc = validate(compose(root))
    assert isinstance(tc, TrainConfig) and isinstance(tc.attention, AttentionConfig)
    assert tc.data.task == "bbc_news_lm" and tc.data.objective == "clm" and tc.data.tokenizer == "byte"
    assert tc.data.max_len == 128 and tc.trainer.max_epochs == 1 and tc.trainer.val_check_interval == 0.25
    assert tc.attention.n_heads == 4 and tc.model.pooling == "mean"
    topics = validate(compose(root + ["data=bbc_news"]))  # another task: the trainer's own budget again
    assert topics.data.objective == "classification" and topics.data.tokenizer == "bpe"
    assert topics.trainer.max_epochs == 6
    assert topics.data.max_len == 256 and topics.trainer.val_check_interval == 1.0
    assert set(tc.logger) == {"wandb", "csv", "tensorboard"} and tc.logger.wandb.mode == "offline"
    assert set(tc.callbacks) == {"head_stats", "progress_log", "lr_monitor", "rich_progress_bar"}


GROUPS = ["attention=mha", "attention=gqa", "attention=mqa", "trainer=cpu", "trainer=ddp", "logger=wandb",
          "logger=csv", "logger=tensorboard", "logger=many", "callbacks=none", "debug=fast", "debug=overfit",
          "debug=profile", "stats=off", "stats=every_step", "data=listops", "data=bbc_news_mlm", "data=ag_news",
          "data=imdb", "data=sst2", "data=wikitext2", "data=tiny_shakespeare", "data=bbc_news", "data=bbc_news_lm"]


@pytest.mark.parametrize("group", GROUPS)
def test_every_group_option_composes_and_validates(group, root):
    validate(compose(root + [group]))


def test_gpu_trainer_composes_as_bf16(root):
    assert validate(compose(root + ["trainer=gpu"])).trainer.precision == "bf16-mixed"


def test_yaml_holds_only_values_that_differ_from_the_schema(root):
    """A group file repeating a schema default would be a second place for that default."""
    import dataclasses

    from mhalab.architecture import ModelConfig
    from mhalab.config.schema import OptimConfig, StatsConfig, TrainerConfig

    defaults = {"model": ModelConfig(), "optim": OptimConfig(), "stats": StatsConfig(), "trainer": TrainerConfig(),
                "attention": AttentionConfig()}
    from importlib.resources import files

    import yaml

    conf = files("mhalab.conf")
    for group, default in defaults.items():
        for f in conf.joinpath(group).iterdir():
            values = yaml.safe_load(f.read_text()) or {}
            same = [k for k, v in values.items() if k != "defaults" and getattr(default, k, object()) == v]
            assert not same, f"{group}/{f.name} repeats schema defaults {same}"
    for f in conf.joinpath("data").iterdir():
        values = yaml.safe_load(f.read_text()) or {}
        from mhalab.data.config import DataConfig

        same = [k for k, v in values.items() if k != "task" and getattr(DataConfig(), k, object()) == v]
        assert not same, f"data/{f.name} repeats schema defaults {same}"
    assert dataclasses.is_dataclass(TrainConfig)


BAD = [
    # trainer
    (["trainer.max_steps=-5"], "trainer.max_steps=-5"),
    (["trainer.max_steps=0"], "trainer.max_steps=0"),
    (["trainer.val_check_interval=0"], "trainer.val_check_interval=0"),
    (["trainer.val_check_interval=1.5"], "trainer.val_check_interval=1.5"),
    (["trainer.devices=abc"], "trainer.devices='abc'"),
    (["trainer.precision=17"], "trainer.precision='17'"),
    (["+trainer.foo=1"], "foo"),
    (["trainer.accumulate_grad_batches=0"], "trainer.accumulate_grad_batches=0"),
    (["trainer.limit_val_batches=0"], "trainer.limit_val_batches=0"),
    (["trainer.max_epochs=-1", "trainer.max_steps=-1"], "training would never end"),
    (["trainer.num_sanity_val_steps=-2"], "trainer.num_sanity_val_steps=-2"),
    (["trainer.strategy=horovod"], "trainer.strategy='horovod'"),
    (["trainer.accelerator=tpu"], "trainer.accelerator='tpu'"),
    (["trainer.profiler=magic"], "trainer.profiler='magic'"),
    (["trainer.log_every_n_steps=0"], "trainer.log_every_n_steps=0"),
    # optim
    (["optim.betas=[2,3]"], "optim.betas[0]=2"),
    (["optim.betas=[0.9]"], "optim.betas="),
    (["optim.eps=-1"], "optim.eps=-1"),
    (["optim.lr=0"], "optim.lr=0"),
    (["optim.warmup_ratio=1.5"], "optim.warmup_ratio=1.5"),
    (["optim.min_lr_ratio=2"], "optim.min_lr_ratio=2"),
    # top level
    (["seed=4294967296"], "seed=4294967296"),
    (["seed=-1"], "seed=-1"),
    (["torch_threads=-1"], "torch_threads=-1"),
    (["task_name=../../x"], "task_name='../../x'"),
    (["task_name=''"], "task_name=''"),
    # model and attention
    (["attention.n_heads=8", "attention.n_kv_heads=3"],
     "attention.n_kv_heads=3 with attention.n_heads=8: n_kv_heads must divide n_heads"),
    (["attention.n_heads=abc"], "attention.n_heads"),
    (["attention.n_heads=0"], "attention.n_heads=0"),
    (["attention.d_head=-2"], "attention.d_head=-2"),
    (["model.d_model=30"], "d_model must be divisible by n_heads, or set attention.d_head"),
    (["attention.backend=flash9"], "attention.backend='flash9'"),
    (["attention.dropout=1.0"], "attention.dropout=1.0"),
    (["model.norm=sandwich"], "model.norm='sandwich'"),
    (["model.pos=alibi"], "model.pos='alibi'"),
    (["model.dropout=1.0"], "model.dropout=1.0"),
    (["model.pos=rotary", "model.rotary_dim=3"], "model.rotary_dim"),
    (["model.rope_base=0.5"], "model.rope_base=0.5"),
    (["model.max_len=100000000"], "model.max_len=100000000"),
    (["attention.d_head=100000000"], "GiB"),  # the memory estimate: about 800 GiB of parameters and optimizer state
    (["model.param_match={n_heads:3}"], "model.param_match"),
    (["+model.param_match={n_heads:3}"], "cannot be composed"),
    (["attention.n_head=4"], "did you mean n_heads?"),  # not Hydra's hint to add it: the schema has no such key
    (["+attention.n_head=4"], "n_head"),
    # data
    (["data=bbc"], "Available options in 'data'"),
    (["data.task=squad"], "data.task='squad'"),
    (["data.max_len=1024"], "data.max_len=1024 is longer than the positional table model.max_len=512"),
    (["data.batch_size=0"], "data.batch_size=0"),
    (["data.num_workers=-1"], "data.num_workers=-1"),
    (["data.val_fraction=0.6", "data.test_fraction=0.5"], "their sum must be below 1"),
    (["data.tokenizer=wordpiece"], "data.tokenizer='wordpiece'"),
    (["data.objective=regression"], "data.objective='regression'"),
    (["data=wikitext2", "data.objective=classification"], "a language-modelling task has no labels"),
    (["data=bbc_news", "data.vocab_size=100"], "data.vocab_size=100 with data.tokenizer=bpe"),
    (["data=listops", "data.listops.max_length=200"], "data.listops.max_length=200"),
    (["data.mlm_probability=1.5"], "data.mlm_probability=1.5"),
    (["data.path=/nonexistent/file.csv"], "data.path file /nonexistent/file.csv does not exist"),
    # stats, checkpoints, faults, resume
    (["stats.max_plot_tokens=0"], "stats.max_plot_tokens=0"),
    (["stats.probe_size=0"], "stats.probe_size=0"),
    (["stats.every_n_steps=0"], "stats.every_n_steps=0"),
    (["checkpoint.every_n_steps=0"], "checkpoint.every_n_steps=0"),
    (["checkpoint.mode=best"], "checkpoint.mode='best'"),
    (["ckpt_path=/nonexistent.ckpt"], "ckpt_path=/nonexistent.ckpt"),
    (["resume=/nonexistent/run"], "is not a run directory"),
    (["resume=true"], "no run under"),
]


def test_bad_fault_setting_is_one_sentence_naming_the_key_before_anything_is_written(root, tmp_path, monkeypatch):
    monkeypatch.setenv("MHALAB_FAULTS", "kill_at=nowhere")  # faults are set by the environment only
    with pytest.raises(ConfigError) as e:
        preflight(root)
    assert "fault.kill_at='nowhere'" in str(e.value), str(e.value)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").rglob("*/runs/*"))


@pytest.mark.parametrize("overrides,message", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_value_is_one_sentence_naming_the_key_before_anything_is_written(overrides, message, root, tmp_path):
    with pytest.raises(ConfigError) as e:
        preflight(root + overrides)
    assert message in str(e.value), str(e.value)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").rglob("*/runs/*"))


def test_at_least_forty_bad_inputs_are_covered():
    assert len(BAD) >= 40


def test_gpu_trainer_without_a_gpu_is_refused(root):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ConfigError, match="no CUDA GPU is available"):
        preflight(root + ["trainer=gpu"])


def test_unwritable_log_dir_is_refused(tmp_path):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where a directory should be")
    with pytest.raises(ConfigError, match="paths.log_dir=.* is not writable"):
        preflight([f"paths.log_dir={blocked}/logs"])


def test_every_job_of_a_sweep_is_checked_before_any_runs(root):
    with pytest.raises(ConfigError, match="attention.n_kv_heads=3"):
        preflight(["-m", *root, "attention.n_heads=8", "attention.n_kv_heads=1,3,4"])
    plan = preflight(["-m", *root, "attention.n_heads=4", "attention.n_kv_heads=1,2,4"])
    assert [tc.attention.n_kv_heads for _, tc in plan.jobs] == [1, 2, 4]


def test_informational_flags_run_no_job():
    assert preflight(["--help"]).show_only and preflight(["--cfg", "job"]).show_only


def test_launcher_and_sweeper_configs_compose(root):
    for override, target in (("hydra/launcher=parallel", "JoblibLauncher"), ("hydra/launcher=slurm", "SlurmLauncher"),
                             ("hydra/sweeper=search", "OptunaSweeper")):
        cfg = compose(root + [override])
        node = cfg.hydra.launcher if "launcher" in override else cfg.hydra.sweeper
        assert node._target_.endswith(target)


EXPERIMENTS = ["kv_sweep", "head_sweep", "head_dim_sweep"]
SETUPS = ["mqar_cpu", "mqar_gpu", "lm_gpu"]


@pytest.mark.parametrize("experiment", slow_except(EXPERIMENTS, keep={"head_dim_sweep"}))  # d_ff matched per arm
def test_every_sweep_expands_into_checked_parameter_matched_jobs(experiment, root):
    from importlib.resources import files

    from mhalab.cost import encoder_params

    plan = preflight(["-m", *root, f"experiment={experiment}"])
    seeds = {tc.seed for _, tc in plan.jobs}
    assert len(seeds) >= 3 and seeds == set(range(len(seeds))) and len(plan.jobs) >= 3 * len(seeds)  # >= 3 seeds
    params = [encoder_params(tc.architecture(69, "clm", None)) for _, tc in plan.jobs]
    widest = max(tc.model.d_model for _, tc in plan.jobs) * 2 + 1
    assert max(params) - min(params) <= 2 * widest  # arms within a feed-forward unit per layer of each other
    text = files("mhalab.conf").joinpath("experiment", f"{experiment}.yaml").read_text()
    assert text.startswith("# @package _global_") and "override /setup:" in text  # an axis on a setup, no copy


@pytest.mark.parametrize("setup", SETUPS)
def test_every_setup_composes_under_every_axis(setup, root):
    for experiment in EXPERIMENTS:
        tc = validate(compose(root + [f"experiment={experiment}", f"setup={setup}"]))
        assert tc.data.task == ("wikitext103" if setup == "lm_gpu" else "mqar") and tc.task_name == experiment
        assert ("gpu" in setup) == (tc.trainer.accelerator == "gpu")
