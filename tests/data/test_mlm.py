"""bbc_news_mlm: document split, windows, BERT masking."""

import pytest
import torch

from mhalab.data import DataConfig, build_datamodule
from mhalab.data.collate import MLMCollator
from mhalab.data.sources import load_raw


@pytest.fixture(scope="module")
def dm(tmp_path_factory):
    dm = build_datamodule({"task": "bbc_news_mlm", "cache_dir": str(tmp_path_factory.mktemp("cache")), "max_len": 128})
    dm.prepare_data()
    dm.setup()
    return dm


def test_same_document_split_as_bbc_news(tmp_path):
    cls = load_raw(DataConfig.from_any({"task": "bbc_news", "cache_dir": str(tmp_path)}))
    mlm = load_raw(DataConfig.from_any({"task": "bbc_news_mlm", "cache_dir": str(tmp_path)}))
    for split in ("train", "validation", "test"):
        assert list(mlm[split]["id"]) == list(cls[split]["id"])
        assert "label" not in mlm[split].column_names


def test_windows_cover_the_split(dm):
    assert (dm.objective, dm.causal, dm.n_classes, dm.label_names) == ("mlm", False, None, None)
    val = dm.datasets["validation"]
    lengths = [len(val[i]["input_ids"]) for i in range(len(val))]
    assert max(lengths) == 128 and all(n == 128 for n in lengths[:-1])
    ids = torch.cat([val[i]["input_ids"] for i in range(len(val))])
    raw = load_raw(dm.cfg)["validation"]
    assert int((ids == dm.sep_id).sum()) == len(raw)  # one [SEP] after every document
    # bits-per-byte bookkeeping: token_bytes sums to the UTF-8 size of the text
    assert int(dm.token_bytes[ids].sum()) == sum(len(t.encode("utf-8")) for t in raw["text"])


def test_masking_rate_and_labels(dm):
    val = dm.datasets["validation"]
    examples = [val[i] for i in range(256)]
    # train masks come from (seed, epoch, idx), so this is reproducible without seeding anything
    batch = dm.collate_fn("train")(examples)
    original = torch.stack([e["input_ids"] for e in examples])
    x, y = batch["input_ids"], batch["labels"]
    chosen = y != -100
    rate = chosen.float().mean().item()
    assert 0.14 < rate < 0.16
    assert torch.equal(y[chosen], original[chosen])
    assert torch.equal(x[~chosen], original[~chosen])  # nothing changes where nothing is predicted
    kept = (x[chosen] == original[chosen]).float().mean().item()
    masked = (x[chosen] == dm.mask_id).float().mean().item()
    assert 0.77 < masked < 0.83 and 0.08 < kept < 0.13  # 10% kept + random draws that hit the same byte
    assert bool((x[chosen] >= 5).logical_or(x[chosen] == dm.mask_id).all())  # random ids are never special


def test_special_and_padding_never_predicted(dm):
    collate = MLMCollator(0, 4, 5, 261, 0.5, train_seed=0)
    short = {"input_ids": torch.tensor([2, 3, 10, 11, 12]), "idx": torch.tensor(0)}
    long = {"input_ids": torch.tensor([10, 11, 12, 13, 14, 15, 16, 3]), "idx": torch.tensor(1)}
    for _ in range(20):
        batch = collate([short, long])
        assert bool((batch["labels"][0, :2] == -100).all()) and bool((batch["labels"][:, -1] == -100).all())
        assert bool((batch["labels"][0, 5:] == -100).all()) and bool(batch["padding_mask"][0, 5:].all())
        assert bool(((batch["labels"] != -100).sum(1) >= 1).all()), "every sequence predicts something"


def test_validation_masks_fixed_train_masks_random(dm):
    val = dm.datasets["validation"]
    first = next(iter(dm.val_dataloader()))
    again = next(iter(dm.val_dataloader()))
    assert all(torch.equal(first[k], again[k]) for k in first)
    # the mask of an example does not depend on the batch it is in
    pair = dm.collate_fn("validation")([val[1], val[0]])
    assert torch.equal(pair["labels"][1], first["labels"][0])
    assert torch.equal(dm.probe_batch()["labels"], dm.probe_batch()["labels"])
    test_batch = dm.collate_fn("test")([val[0]])
    assert not torch.equal(test_batch["labels"][0], first["labels"][0]), "test uses its own seed"
    train = dm.collate_fn("train")  # masks from (seed, epoch, idx): fresh every epoch, reproducible within one
    epoch0 = train([val[0]])["labels"]
    assert torch.equal(train([val[0]])["labels"], epoch0)
    assert torch.equal(train([{**val[0], "epoch": 0}])["labels"], epoch0)
    assert not torch.equal(train([{**val[0], "epoch": 1}])["labels"], epoch0)  # the epoch travels with the example
