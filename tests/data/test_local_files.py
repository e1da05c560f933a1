"""data.path: local CSV / JSONL / text / Parquet files through load_dataset, for any task, and their errors."""

import json

import pandas as pd
import pytest
import torch

from mhalab.data import build_datamodule
from mhalab.errors import ConfigError

AG_NAMES = ["World", "Sports", "Business", "Sci/Tech"]


def rows(n=50, n_classes=4):
    return [{"text": f"headline number {i} about topic {i % n_classes}", "label": i % n_classes} for i in range(n)]


def write(path, records, fmt):
    if fmt == "csv":
        pd.DataFrame(records).to_csv(path, index=False)
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    elif fmt == "parquet":
        pd.DataFrame(records).to_parquet(path)
    return str(path)


def setup_dm(tmp_path, **cfg):
    dm = build_datamodule({"cache_dir": str(tmp_path / "cache"), "max_len": 64, **cfg})
    dm.prepare_data()
    dm.setup()
    return dm


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_classification_file_replaces_hub_task(fmt, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the Hub is never asked
    path = write(tmp_path / f"news.{fmt}", rows(80), fmt)
    dm = setup_dm(tmp_path, task="ag_news", path=path)
    assert {s: len(d) for s, d in dm.datasets.items()} == {"train": 64, "validation": 8, "test": 8}
    assert dm.n_classes == 4 and dm.label_names == AG_NAMES
    batch = next(iter(dm.train_dataloader()))
    assert batch["labels"].shape == (32,) and bool((batch["input_ids"][:, 0] == dm.cls_id).all())
    text = bytes(int(i) - 5 for i in dm.datasets["test"][0]["input_ids"][1:]).decode()
    assert text.startswith("headline number")


def test_data_file_takes_its_classes_from_the_file(tmp_path, monkeypatch):
    """`data=file data.path=...`: no task to borrow from; string labels are the class names, sorted."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    records = [{"text": f"review {i}", "label": ("bad", "good", "meh")[i % 3]} for i in range(60)]
    dm = setup_dm(tmp_path, task="file", path=write(tmp_path / "reviews.csv", records, "csv"))
    assert dm.objective == "classification" and dm.n_classes == 3 and dm.label_names == ["bad", "good", "meh"]
    assert dm.task == "file:reviews.csv"
    with pytest.raises(ConfigError, match="data.task=file needs data.path"):
        build_datamodule({"task": "file"})
    ints = write(tmp_path / "ints.csv", rows(40, 2), "csv")
    with pytest.raises(ConfigError, match="integer labels need data.n_classes"):
        setup_dm(tmp_path, task="file", path=ints)
    assert setup_dm(tmp_path, task="file", path=ints, n_classes=2).n_classes == 2


def test_text_file_for_language_modelling(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"paragraph {i}:\nthe quick brown fox\njumps over the lazy dog\n\n" for i in range(60)))
    dm = setup_dm(tmp_path, task="wikitext2", path=str(path), max_len=32)
    assert dm.objective == "mlm" and dm.n_classes is None
    assert all(len(ds) > 0 for ds in dm.datasets.values())
    assert max(len(x) for x in dm.datasets["train"]["input_ids"]) == 32
    ids = torch.cat([x for x in dm.datasets["validation"]["input_ids"]])
    assert int((ids == dm.sep_id).sum()) == 6  # 60 paragraphs -> 6 validation documents, newlines kept inside
    assert "↵" in dm.decode(ids)
    batch = next(iter(dm.val_dataloader()))
    assert batch["labels"].shape == batch["input_ids"].shape
    clm = setup_dm(tmp_path, task="tiny_shakespeare", path=str(path), max_len=32)
    assert clm.causal and next(iter(clm.train_dataloader()))["labels"].shape[1] <= 32


def test_given_splits_and_label_names(tmp_path):
    names = ["business", "entertainment", "politics", "sports", "tech"]
    train = [{"body": f"story {i}", "topic": names[i % 5]} for i in range(50)]
    test = [{"body": f"other story {i}", "topic": names[i % 5]} for i in range(10)]
    path = {"train": write(tmp_path / "train.csv", train, "csv"), "test": write(tmp_path / "test.csv", test, "csv")}
    dm = setup_dm(tmp_path, task="bbc_news", path=path, text_column="body", label_column="topic")
    assert {s: len(d) for s, d in dm.datasets.items()} == {"train": 45, "validation": 5, "test": 10}
    assert sorted(dm.probe_batch(10)["labels"].tolist()) == [0, 1, 2, 3, 4]
    assert sorted(int(y) for y in dm.datasets["test"]["label"]) == sorted(i % 5 for i in range(10))


def test_cache_follows_the_file(tmp_path):
    path = tmp_path / "news.csv"
    write(path, rows(80), "csv")
    first = setup_dm(tmp_path, task="ag_news", path=str(path))
    write(path, rows(40), "csv")
    second = setup_dm(tmp_path, task="ag_news", path=str(path))
    assert len(first.datasets["train"]) == 64 and len(second.datasets["train"]) == 32


def bad_labels(tmp_path):
    return write(tmp_path / "bad.csv", [{"text": "a", "label": 0}, {"text": "b", "label": 7}], "csv")


def non_utf8(tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes("text,label\ncaf\xe9 au lait,1\n".encode("latin-1"))
    return str(path)


def empty(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    return str(path)


def no_text_column(tmp_path):
    return write(tmp_path / "cols.jsonl", [{"body": "x", "label": 1}], "jsonl")


def no_label_column(tmp_path):
    return write(tmp_path / "cols.parquet", [{"text": "x", "topic": 1}], "parquet")


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda p: str(p / "missing.csv"), r"missing\.csv does not exist"),
        (empty, r"empty\.jsonl is empty"),
        (non_utf8, r"latin1\.csv is not UTF-8"),
        (bad_labels, r"holds 7 in the train split, outside the allowed ids 0\.\.3"),
        (no_text_column, r"no column 'text' \(data\.text_column\)"),
        (no_label_column, r"no column 'label' \(data\.label_column\)"),
        (lambda p: str(p / "x.docx"), r"extension '\.docx'"),
    ],
)
def test_file_errors(make, expected, tmp_path):
    path = make(tmp_path)
    with pytest.raises(ConfigError, match=expected) as err:
        setup_dm(tmp_path, task="ag_news", path=path)
    assert "data.path" in str(err.value) or "data.label_column" in str(err.value)


def test_too_few_documents(tmp_path):
    path = tmp_path / "one.txt"
    path.write_text("a single paragraph\nwithout blank lines\n")
    with pytest.raises(ConfigError, match="empty validation split"):
        setup_dm(tmp_path, task="wikitext2", path=str(path))
