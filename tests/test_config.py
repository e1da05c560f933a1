"""Config composition and early validation (in-process: fast)."""

import os

import pytest
from hydra import compose, initialize_config_dir

from mhalab.config import validate
from mhalab.errors import ConfigError
from mhalab.train import CONF_DIR


def composed(*overrides):
    os.environ.setdefault("MHALAB_ROOT", "/tmp")
    os.environ.setdefault("MHALAB_RUN_ID", "test")
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=False)


def test_default_config_composes_and_validates():
    cfg = composed()
    validate(cfg)
    assert cfg.data.task == "bbc_news" and cfg.attention.n_heads == 4 and cfg.logger.wandb.mode == "offline"
    assert set(cfg.logger) == {"wandb", "csv", "tensorboard"}


@pytest.mark.parametrize("group", ["attention=mha", "attention=gqa", "attention=mqa", "trainer=cpu", "trainer=gpu",
                                   "trainer=ddp", "logger=wandb", "logger=csv", "logger=tensorboard", "debug=fast",
                                   "debug=overfit", "debug=profile", "stats=off", "stats=every_step",
                                   "data=listops", "data=bbc_news_mlm", "data=ag_news", "data=imdb", "data=sst2",
                                   "data=wikitext2", "data=tiny_shakespeare"])
def test_every_group_option_composes(group):
    validate(composed(group))


def test_gpu_trainer_is_bf16():
    assert composed("trainer=gpu").trainer.precision == "bf16-mixed"


@pytest.mark.parametrize("overrides,message", [
    (["attention.n_heads=8", "attention.n_kv_heads=3"],
     "attention.n_kv_heads=3 with attention.n_heads=8: n_kv_heads must divide n_heads"),
    (["attention.n_heads=abc"], "attention.n_heads='abc': n_heads must be an integer"),
    (["attention.n_heads=0"], "attention.n_heads=0: n_heads must be >= 1"),
    (["attention.d_head=-2"], "attention.d_head=-2"),
    (["model.d_model=30", "attention.n_heads=4"], "d_model must be divisible by n_heads, or set attention.d_head"),
    (["attention.backend=flash9"], "backend='flash9': backend must be one of sdpa, math"),
    (["model.norm=sandwich"], "model.norm='sandwich'"),
    (["data.max_len=1024"], "data.max_len=1024 is longer than the positional table model.max_len=512"),
    (["optim.lr=0"], "optim.lr=0: lr must be > 0"),
    (["+attention.n_head=4"], "unknown key attention.n_head"),
    (["logger.csv._target_=os.system"], "logger.csv._target_='os.system'"),
])
def test_invalid_values_fail_with_one_sentence_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as e:
        validate(composed(*overrides))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_launcher_and_sweeper_configs_compose():
    os.environ.setdefault("MHALAB_ROOT", "/tmp")
    os.environ.setdefault("MHALAB_RUN_ID", "test")
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        for override, target in (("hydra/launcher=parallel", "JoblibLauncher"),
                                 ("hydra/launcher=slurm", "SlurmLauncher"),
                                 ("hydra/sweeper=search", "OptunaSweeper")):
            cfg = compose("train", overrides=[override], return_hydra_config=True)
            node = cfg.hydra.launcher if "launcher" in override else cfg.hydra.sweeper
            assert node._target_.endswith(target)
