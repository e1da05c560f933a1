"""Built-in tasks are `Task` objects found in mhalab/data/tasks/: each one validates and loads a tiny version, and
every task's raw splits and first batches are pinned to the hashes main's code gave before tasks were objects."""

import dataclasses
import hashlib
import sys

import pytest
import torch
from datasets import Dataset, DatasetDict

from mhalab.data import TASKS, DataConfig, build_datamodule, hub
from mhalab.data.config import SETTINGS
from mhalab.data.sources import load_raw
from mhalab.data.tasks import Task
from mhalab.errors import ConfigError

USER_TASK = '''
from datasets import Dataset, DatasetDict
from mhalab.data.config import TaskInfo
from mhalab.data.tasks import Task


class Parity(Task):
    info = TaskInfo(objective="classification", source="user", label_names=("even", "odd"))

    def __init__(self, n: int = 300):
        self.n = n

    def load(self, cfg):
        texts = [format(i, "b") for i in range(self.n)]
        return DatasetDict({"train": Dataset.from_dict({"text": texts, "label": [t.count("1") % 2 for t in texts]})})
'''
SMALL = {"limit": 64, "max_len": 64, "batch_size": 8}
GENERATED = {"n_train": 256, "n_val": 64, "n_test": 64}
# data config -> raw splits and first batches, as main's code (3a292b4, TASKS table and string dispatch) gave them
CONFIGS = {
    "bbc_news": ({"task": "bbc_news", **SMALL, "vocab_size": 300}, "c9760300d3809968", "3d70260e06340b26"),
    "bbc_news_lm_default": ({"task": "bbc_news_lm", "max_len": 128}, "b22469722e18185a", "fb9af583d66da79c"),
    "bbc_news_mlm": ({"task": "bbc_news_mlm", **SMALL}, "5d6ed8860f10f673", "e47247e180fb836a"),
    "listops": ({"task": "listops", "max_len": 128, "batch_size": 8,
                 "listops": {"n_train": 200, "n_val": 40, "n_test": 40}}, "84ca0f73bc0ad215", "30d7d7a92c212820"),
    "mqar": ({"task": "mqar", "batch_size": 8, "mqar": GENERATED}, "8fe1b0da8ace5720", "d4b53b8ed514fb3b"),
    "mqar_limit": ({"task": "mqar", "batch_size": 8, "limit": 32, "mqar": GENERATED}, "0f94b77c2a250540",
                   "07b636920eebbbb6"),
    "qgram_ar": ({"task": "qgram_ar", "batch_size": 8, "qgram_ar": GENERATED}, "2e3cbfa41358e506", "f77a37ae30c0dbb4"),
    "file_csv": ({"task": "file", "path": "my.csv", **SMALL}, "241561c3a25c46b7", "13c0fc231f20f549"),
    "file_txt_clm": ({"task": "file", "path": "corpus.txt", "objective": "clm", **SMALL}, "1a392fa1cc2f396f",
                     "0371feb07e33d7b7"),
    "bbc_news_with_path": ({"task": "bbc_news", "path": "my.csv", **SMALL, "tokenizer": "byte"}, "241561c3a25c46b7",
                           "13c0fc231f20f549"),
    "user_parity": ({"task": "parity", "source": {"_target_": "mytasks_hash.Parity", "n": 300}, **SMALL},
                    "d8859e5dcd7343e0", "c659bcc9ebfc626c"),
    "hub_ag_news": ({"task": "ag_news", **SMALL}, "e375d204a22686e3", "6dc8c07d932824f2"),
    "hub_imdb": ({"task": "imdb", **SMALL}, "6cdb0497b658cf3f", "f0fffccb1e3f7523"),
    "hub_sst2": ({"task": "sst2", **SMALL}, "7a751cd08a9a28f0", "9d275911d4d064f1"),
    "hub_wikitext2": ({"task": "wikitext2", **SMALL}, "6637e99845028378", "6d02220ce95fb503"),
    "hub_wikitext103": ({"task": "wikitext103", **SMALL}, "a8975bc81df64198", "8099184e91ba76fb"),
    "hub_tiny_shakespeare": ({"task": "tiny_shakespeare", **SMALL}, "b4ab974d9eea72eb", "c8a6f643a32274db"),
}


def fake_hub(task, repo, config, cache):
    """A Hub dataset made here (nothing from the network): 200 train and 200 test rows, labels 0..k-1."""
    text = [f"{task} document {i} " + "word " * (i % 7) for i in range(400)]
    col = "sentence" if task == "sst2" else "text"
    k = {"ag_news": 4, "imdb": 2, "sst2": 2}.get(task, 2)
    part = lambda lo: Dataset.from_dict({col: text[lo:lo + 200], "label": [i % k for i in range(lo, lo + 200)]})
    return DatasetDict({"train": part(0), "test": part(200)})


@pytest.fixture
def files(tmp_path, monkeypatch):
    """The local files and the user task the configs name, a fake Hub, and the user task's package granted."""
    (tmp_path / "my.csv").write_text(
        "text,label\n" + "".join(f"\"row {i} {'x' * (i % 5)}\",{'ab'[i % 2]}\n" for i in range(60)))
    (tmp_path / "corpus.txt").write_text("\n\n".join(f"paragraph {i} " + "lorem " * (i % 9) for i in range(60)))
    (tmp_path / "mytasks_hash.py").write_text(USER_TASK)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("MHALAB_ALLOW", "mytasks_hash")
    monkeypatch.setattr(hub, "load_hub", fake_hub)
    yield tmp_path
    sys.modules.pop("mytasks_hash", None)


def config(name, folder) -> DataConfig:
    node = dict(CONFIGS[name][0])
    if "path" in node:
        node["path"] = str(folder / node["path"])
    return DataConfig.from_any({**node, "cache_dir": str(folder / "cache")})


def digest(obj) -> str:
    h = hashlib.sha256()

    def feed(x):
        if isinstance(x, torch.Tensor):
            h.update(str(x.dtype).encode() + str(tuple(x.shape)).encode())
            h.update(x.contiguous().numpy().tobytes())
        elif isinstance(x, dict):
            for k in sorted(x):
                h.update(k.encode())
                feed(x[k])
        elif isinstance(x, (list, tuple)):
            for v in x:
                feed(v)
        else:
            h.update(repr(x).encode())

    feed(obj)
    return h.hexdigest()[:16]


def test_registry_lists_every_built_in_task():
    assert set(TASKS) >= {"ag_news", "bbc_news", "bbc_news_lm", "bbc_news_mlm", "file", "imdb", "listops", "mqar",
                          "qgram_ar", "sst2", "tiny_shakespeare", "wikitext103", "wikitext2"}
    for name, task in TASKS.items():
        assert issubclass(task, Task) and task.name == name and task.info.objective in ("classification", "mlm", "clm")
    assert {name: cls.__name__ for name, cls in SETTINGS.items()}.items() >= \
        {"listops": "ListOpsConfig", "mqar": "MqarConfig", "qgram_ar": "QgramConfig"}.items()
    assert {f.name for f in dataclasses.fields(DataConfig)} >= set(SETTINGS)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_data_is_what_main_gave(name, files):
    """Every built-in task (and data.path, and a user task) validates, loads and batches exactly as before."""
    cfg = config(name, files)
    raw = load_raw(cfg)
    raw_d = {s: ds.to_dict() for s, ds in raw.items()}
    raw_d["features"] = {s: str(ds.features) for s, ds in raw.items()}
    dm = build_datamodule(cfg, seed=0)
    dm.prepare_data()
    dm.setup()
    train = iter(dm.train_dataloader())
    batches = {"train": [next(train) for _ in range(2)], "val": next(iter(dm.val_dataloader())),
               "test": next(iter(dm.test_dataloader())), "sizes": {s: len(d) for s, d in dm.datasets.items()},
               "vocab": dm.vocab_size, "labels": dm.label_names}
    assert (digest(raw_d), digest(batches)) == CONFIGS[name][1:]


def test_every_built_in_task_is_covered():
    assert {c[0]["task"] for c in CONFIGS.values()} >= set(TASKS)


@pytest.mark.parametrize("node, examples", [
    ({"task": "mqar", "mqar": GENERATED}, 256), ({"task": "mqar", "mqar": GENERATED, "limit": 10}, 10),
    ({"task": "qgram_ar"}, 20000), ({"task": "listops", "max_len": 256}, 8000), ({"task": "bbc_news"}, None),
    ({"task": "listops", "max_len": 256, "path": "x.csv", "tokenizer": "byte"}, None)])
def test_train_examples_come_from_the_task(node, examples):
    assert DataConfig(**node).train_examples == examples


@pytest.mark.parametrize("node, says", [
    ({"task": "file"}, "data.task=file needs data.path"),
    ({"task": "wikitext2", "objective": "classification"}, "a language-modelling task has no labels"),
    ({"task": "listops", "max_len": 64}, "data.listops.max_length=127 with data.max_len=64"),
    ({"task": "mqar", "max_len": 32}, "data.mqar.seq_len=64 is longer than data.max_len=32"),
    ({"task": "qgram_ar", "objective": "mlm"}, "data.objective=mlm with data.task=qgram_ar"),
    ({"task": "mqar", "mqar": {"n_kv_pairs": 40}}, "mqar n_kv_pairs=40 is not allowed"),
    ({"task": "bbc_news", "tokenizer": "listops"}, "the listops vocabulary only fits data.task=listops"),
    ({"task": "bbc_news", "tokenizer": "ids"}, "a synthetic task (mqar, qgram_ar) brings its own ids"),
    ({"task": "nope"}, "data.task='nope' is unknown; allowed tasks are ag_news, bbc_news,"),
])
def test_each_task_checks_its_own_keys(node, says, tmp_path):
    with pytest.raises(ConfigError) as err:
        DataConfig.from_any({**node, "cache_dir": str(tmp_path)})
    assert says in str(err.value)
