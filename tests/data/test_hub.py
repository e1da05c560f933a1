"""Hub tasks: fail fast offline with a clear error, but load what is already in the cache."""

import glob
import json
import os
import shutil
import time

import datasets
import huggingface_hub.constants
import pandas as pd
import pytest

from mhalab.data import build_datamodule, hub
from mhalab.errors import ConfigError

HUB_TASKS = ["ag_news", "imdb", "sst2", "wikitext2", "wikitext103", "tiny_shakespeare"]


@pytest.fixture
def online_env(monkeypatch):
    """No offline variables set: the connectivity check decides."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)


def assert_offline_error(task, cfg, seconds=5.0):
    start = time.monotonic()
    with pytest.raises(ConfigError) as err:
        build_datamodule(cfg).prepare_data()
    assert time.monotonic() - start < seconds
    msg = str(err.value)
    for part in (f"data.task={task}", "data=bbc_news", "data=bbc_news_mlm", "data=listops", "data.path=<local file>"):
        assert part in msg
    assert not datasets.config.HF_HUB_OFFLINE and not huggingface_hub.constants.HF_HUB_OFFLINE, "offline mode restored"
    return msg


@pytest.mark.parametrize("task", HUB_TASKS)
def test_offline_env_fails_fast(task, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = {"task": task, "cache_dir": str(tmp_path), "hf_cache_dir": str(tmp_path / "hf")}
    msg = assert_offline_error(task, cfg)
    assert str(tmp_path / "hf") in msg and "offline mode is set" in msg


def test_unreachable_endpoint_fails_fast(tmp_path, monkeypatch, online_env):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # a closed port
    assert not hub.hub_reachable()
    msg = assert_offline_error("wikitext2", {"task": "wikitext2", "cache_dir": str(tmp_path)})
    assert str(datasets.config.HF_DATASETS_CACHE) in msg and "cannot be reached" in msg


def test_failed_connectivity_check_fails_fast(tmp_path, monkeypatch, online_env):
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=hub.CONNECT_TIMEOUT_S: False)
    assert_offline_error("imdb", {"task": "imdb", "cache_dir": str(tmp_path)})


def test_connection_error_inside_load_dataset(tmp_path, monkeypatch, online_env):
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=hub.CONNECT_TIMEOUT_S: True)

    def refuse(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'fancyzhx/ag_news' on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", refuse)
    assert_offline_error("ag_news", {"task": "ag_news", "cache_dir": str(tmp_path)})


def fake_hub_cache(hf_cache, repo, splits):
    """Put ``splits`` ({name: DataFrame}) in ``hf_cache`` the way ``load_dataset(repo)`` caches a download."""
    build = hf_cache.parent / "build"
    files = {}
    for split, frame in splits.items():
        files[split] = str(build / f"{split}.parquet")
        os.makedirs(build, exist_ok=True)
        frame.to_parquet(files[split])
    datasets.load_dataset("parquet", data_files=files, cache_dir=str(build / "hf"))
    src = next(p for p in glob.glob(str(build / "hf" / "parquet" / "*" / "*" / "*")) if os.path.isdir(p))
    version, digest = src.split(os.sep)[-2:]
    owner, name = repo.split("/")
    dst = hf_cache / f"{owner}___{name}" / "default" / version / digest
    shutil.copytree(src, dst)
    for arrow in glob.glob(str(dst / "*.arrow")):
        os.rename(arrow, arrow.replace("parquet-", f"{name}-"))
    info = json.loads((dst / "dataset_info.json").read_text())
    (dst / "dataset_info.json").write_text(json.dumps({**info, "config_name": "default"}))


def test_cached_dataset_loads_offline(tmp_path, monkeypatch):
    def rows(n, split):
        return pd.DataFrame({"text": [f"{split} news item {i}" for i in range(n)], "label": [i % 4 for i in range(n)]})

    fake_hub_cache(tmp_path / "hf", "fancyzhx/ag_news", {"train": rows(80, "train"), "test": rows(20, "test")})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    dm = build_datamodule({"task": "ag_news", "cache_dir": str(tmp_path / "c"), "hf_cache_dir": str(tmp_path / "hf")})
    dm.prepare_data()
    dm.setup()
    assert {s: len(d) for s, d in dm.datasets.items()} == {"train": 72, "validation": 8, "test": 20}
    assert dm.n_classes == 4 and dm.label_names == ["World", "Sports", "Business", "Sci/Tech"]
    assert next(iter(dm.train_dataloader()))["labels"].shape == (32,)


def test_unlabelled_hub_test_split_is_replaced(tmp_path, monkeypatch):
    def frame(n, label=None):
        labels = [i % 2 if label is None else label for i in range(n)]
        return pd.DataFrame({"idx": range(n), "sentence": [f"sentence {i} {label}" for i in range(n)], "label": labels})

    fake_hub_cache(tmp_path / "hf", "stanfordnlp/sst2",
                   {"train": frame(100), "validation": frame(10), "test": frame(10, -1)})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    dm = build_datamodule({"task": "sst2", "cache_dir": str(tmp_path / "c"), "hf_cache_dir": str(tmp_path / "hf")})
    dm.setup()
    assert {s: len(d) for s, d in dm.datasets.items()} == {"train": 90, "validation": 10, "test": 10}
    assert all(int(y) in (0, 1) for y in dm.datasets["test"]["label"])
