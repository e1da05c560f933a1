"""The data module interface, checked on the offline default task bbc_news (and its yaml)."""

from collections import Counter
from pathlib import Path

import pytest
import torch
from importlib.resources import files

from omegaconf import OmegaConf

from mhalab.data import TASKS, DataConfig, build_datamodule, preprocessing
from mhalab.data.bbc_news import LABEL_NAMES, corpus_dir, drop_duplicates, read_articles, read_text
from mhalab.data.sources import load_raw
from mhalab.errors import ConfigError

CONF = Path(str(files("mhalab.conf").joinpath("data")))
RAW_COUNTS = {"business": 510, "entertainment": 386, "politics": 417, "sports": 511, "tech": 401}
DEDUP_COUNTS = {"business": 503, "entertainment": 369, "politics": 403, "sports": 505, "tech": 347}


def data_node(name: str, cache_dir, **overrides):
    """conf/data/<name>.yaml as the training code sees it: a node under a root that defines paths.cache_dir."""
    node = OmegaConf.load(CONF / f"{name}.yaml")  # a `# @package _global_` file (bbc_news_lm) sets data: itself
    global_ = (CONF / f"{name}.yaml").read_text().startswith("# @package _global_")
    root = OmegaConf.create({"paths": {"cache_dir": str(cache_dir)}, "data": node.data if global_ else node})
    for key, value in overrides.items():
        OmegaConf.update(root, f"data.{key}", value)
    return root.data


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def dm(cache_dir):
    dm = build_datamodule(data_node("bbc_news", cache_dir, tokenizer="byte"), seed=0)  # the byte-level interface
    dm.prepare_data()
    dm.setup()
    return dm


@pytest.fixture(scope="module")
def raw(cache_dir):
    return load_raw(DataConfig.from_any(data_node("bbc_news", cache_dir, tokenizer="byte")))


def test_every_yaml_builds_a_valid_config(tmp_path):
    names = sorted(p.stem for p in CONF.glob("*.yaml"))
    assert names == sorted(TASKS)
    for name in names:
        path = {"path": str(tmp_path / "my.csv")} if name == "file" else {}  # data=file is nothing without a file
        cfg = DataConfig.from_any({**OmegaConf.to_container(data_node(name, tmp_path)), "cache_dir": str(tmp_path),
                                   **path})
        assert cfg.task == name and cfg.objective == TASKS[name].info.objective


def test_raw_counts_and_duplicates():
    rows = read_articles()
    assert Counter(LABEL_NAMES[r["label"]] for r in rows) == RAW_COUNTS
    kept, dropped = drop_duplicates(rows)
    assert dropped == 98
    assert Counter(LABEL_NAMES[r["label"]] for r in kept) == DEDUP_COUNTS
    assert len({r["text"] for r in kept}) == len(kept) == 2127
    # every duplicate repeats an article of the same topic
    first_label = {}
    for r in rows:
        assert first_label.setdefault(r["text"], r["label"]) == r["label"]


def test_latin1_file_is_decoded():
    path = corpus_dir() / "sports" / "199.txt"
    with pytest.raises(UnicodeDecodeError):
        path.read_bytes().decode("utf-8")
    text = read_text(path)
    assert "\ufffd" not in text and "a £15.8m signing from Parma" in text
    assert all("\ufffd" not in r["text"] for r in read_articles())


def test_label_ids_are_sorted_names(dm, raw):
    assert LABEL_NAMES == sorted(LABEL_NAMES) == dm.label_names
    assert dm.n_classes == 5
    ids, labels = list(raw["train"]["id"]), list(raw["train"]["label"])
    for doc_id, label in zip(ids, labels):
        assert doc_id.split("/")[0] == LABEL_NAMES[label]


def test_splits_disjoint_stratified_deterministic(cache_dir, raw):
    assert list(raw) == ["train", "validation", "test"]
    ids = {s: set(raw[s]["id"]) for s in raw}
    texts = {s: set(raw[s]["text"]) for s in raw}
    assert sum(len(v) for v in ids.values()) == 2127
    for a, b in [("train", "validation"), ("train", "test"), ("validation", "test")]:
        assert not ids[a] & ids[b] and not texts[a] & texts[b]
    for split in ("validation", "test"):
        counts = Counter(raw[split]["label"])
        assert {LABEL_NAMES[k]: v for k, v in counts.items()} == {k: round(0.1 * n) for k, n in DEDUP_COUNTS.items()}
    again = load_raw(DataConfig.from_any(data_node("bbc_news", cache_dir, tokenizer="byte")))
    assert all(list(again[s]["id"]) == list(raw[s]["id"]) for s in raw)
    other = load_raw(DataConfig.from_any(data_node("bbc_news", cache_dir, tokenizer="byte", split_seed=1)))
    assert list(other["validation"]["id"]) != list(raw["validation"]["id"])


def test_interface_and_batches(dm):
    assert (dm.task, dm.objective, dm.causal) == ("bbc_news", "classification", False)
    assert dm.vocab_size == 261 and (dm.pad_id, dm.cls_id, dm.mask_id) == (0, 2, 4) and dm.max_len == 256
    assert dm.token_bytes.shape == (261,) and dm.token_bytes.dtype == torch.long
    assert dm.token_bytes[:5].sum() == 0 and bool((dm.token_bytes[5:] == 1).all())
    assert dm.decode([2, 5 + ord("a"), 5 + ord(" "), 0]) == ["[CLS]", "a", "␣", "[PAD]"]
    batch = next(iter(dm.val_dataloader()))
    assert set(batch) == {"input_ids", "padding_mask", "labels"}
    x, pad, y = batch["input_ids"], batch["padding_mask"], batch["labels"]
    assert x.dtype == torch.long and pad.dtype == torch.bool and y.dtype == torch.long
    assert x.shape == pad.shape and x.shape[0] == 32 and y.shape == (32,)
    assert x.shape[1] <= 256 and bool((x[:, 0] == dm.cls_id).all())
    assert torch.equal(pad, x == dm.pad_id)  # byte ids are >= 5, so only padding is 0
    assert not bool(pad[:, -1].all()), "padded to the longest sequence in the batch, no further"
    assert bool(((y >= 0) & (y < 5)).all())


def test_dynamic_padding_to_longest(dm):
    val = dm.datasets["validation"]
    short = sorted(range(len(val)), key=lambda i: len(val[i]["input_ids"]))[:3]
    batch = dm.collate_fn("validation")([val[i] for i in short])
    assert batch["input_ids"].shape[1] == max(len(val[i]["input_ids"]) for i in short)
    width = batch["input_ids"].shape[1]
    assert batch["padding_mask"].sum(1).tolist() == [width - len(val[i]["input_ids"]) for i in short]


def test_train_shuffle_seeded_and_probe_batch_fixed(dm, cache_dir):
    first = next(iter(dm.train_dataloader()))["input_ids"]
    same = build_datamodule(data_node("bbc_news", cache_dir, tokenizer="byte"), seed=0)
    same.setup()
    other = build_datamodule(data_node("bbc_news", cache_dir, tokenizer="byte"), seed=1)
    other.setup()
    assert torch.equal(next(iter(same.train_dataloader()))["input_ids"], first)
    assert not torch.equal(next(iter(other.train_dataloader()))["input_ids"][:, :16], first[:, :16])
    a, b = dm.probe_batch(4), dm.probe_batch(4)
    assert a["input_ids"].shape[0] == 4 and all(torch.equal(a[k], b[k]) for k in a)


def test_setup_reads_cache_and_is_idempotent(dm, cache_dir, monkeypatch):
    folder = preprocessing.cache_path(dm.cfg)
    assert (folder / "meta.json").exists() and (folder / "dataset").is_dir()

    def fail(*args, **kwargs):
        raise AssertionError("tokenized again although the cache exists")

    monkeypatch.setattr(preprocessing, "build", fail)
    again = build_datamodule(data_node("bbc_news", cache_dir, tokenizer="byte"), batch_size=8)
    again.prepare_data()
    again.setup()
    assert again.batch_size == 8 and len(again.datasets["train"]) == len(dm.datasets["train"])
    before = again.datasets
    again.setup("fit")
    assert again.datasets is before
    # a setting that changes the tokens changes the cache key
    shorter = DataConfig.from_any(data_node("bbc_news", cache_dir, tokenizer="byte", max_len=128))
    assert preprocessing.cache_key(shorter) != preprocessing.cache_key(dm.cfg)


def test_limit_and_clm(cache_dir):
    dm = build_datamodule(data_node("bbc_news", cache_dir, tokenizer="byte", objective="clm", limit=20, max_len=64))
    dm.setup()
    assert dm.causal and dm.n_classes is None and dm.label_names is None
    assert all(len(ds) == 20 for ds in dm.datasets.values())
    batch = next(iter(dm.train_dataloader()))
    x, y, pad = batch["input_ids"], batch["labels"], batch["padding_mask"]
    assert y.shape == x.shape
    assert torch.equal(y[:, :-1][~pad[:, 1:]], x[:, 1:][~pad[:, 1:]])
    assert bool((y[:, -1] == -100).all()) and bool((y[:, :-1][pad[:, 1:]] == -100).all())


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"task": "mnist"}, "bbc_news_mlm"),
        ({"objective": "regression"}, "data.objective"),
        ({"tokenizer": "wordpiece"}, "data.tokenizer"),
        ({"val_fraction": 0.6, "test_fraction": 0.5}, "val_fraction"),
        ({"max_len": 1}, "data.max_len"),
        ({"tokenizer": "bpe", "vocab_size": 100}, "data.vocab_size"),
        ({"batch_sise": 8}, "batch_sise"),
        ({"task": "wikitext2", "objective": "classification"}, "data.objective"),
    ],
)
def test_config_errors(overrides, key, tmp_path):
    cfg = {"task": "bbc_news", "cache_dir": str(tmp_path), **overrides}
    with pytest.raises(ConfigError, match=key):
        build_datamodule(cfg)
