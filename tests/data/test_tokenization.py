"""Tokenizers: bytes and BPE (trained on the train split only, cached with the data)."""

import pytest
import torch

from mhalab.data import DataConfig, build_datamodule, preprocessing
from mhalab.data.sources import load_raw
from mhalab.data.tokenization import BpeTokenizer, ByteTokenizer, show_bytes

BPE = {"task": "bbc_news", "tokenizer": "bpe", "vocab_size": 400, "limit": 150, "max_len": 512}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def trained(cache_dir):
    """The BPE data module, and the texts its tokenizer was trained on."""
    seen = []
    original = BpeTokenizer.train.__func__

    def spy(cls, texts, vocab_size):
        texts = list(texts)
        seen.extend(texts)
        return original(cls, iter(texts), vocab_size)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(BpeTokenizer, "train", classmethod(spy))
        dm = build_datamodule({**BPE, "cache_dir": cache_dir})
        dm.prepare_data()
        dm.setup()
    return dm, seen


def test_byte_tokenizer():
    tok = ByteTokenizer()
    ids = tok.encode("a £")
    assert ids == [5 + 97, 5 + 32, 5 + 0xC2, 5 + 0xA3] and tok.vocab_size == 261
    assert tok.decode(ids) == ["a", "␣", "<0xC2>", "<0xA3>"]
    assert show_bytes("£\n".encode()) == "£↵"


def test_bpe_trains_on_train_split_only(trained, cache_dir):
    dm, seen = trained
    raw = load_raw(DataConfig.from_any({**BPE, "cache_dir": cache_dir}))
    assert sorted(seen) == sorted(raw["train"]["text"])
    assert not set(seen) & (set(raw["validation"]["text"]) | set(raw["test"]["text"]))


def test_bpe_vocabulary_and_round_trip(trained, cache_dir):
    dm, _ = trained
    tok = dm.tokenizer
    assert isinstance(tok, BpeTokenizer) and dm.vocab_size == 400
    assert tok.decode(range(5)) == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert (dm.pad_id, dm.cls_id, dm.mask_id) == (0, 2, 4)
    raw = load_raw(DataConfig.from_any({**BPE, "cache_dir": cache_dir}))
    for text in list(raw["test"]["text"])[:20] + ["Chelsea paid £15.8m\nfor Mutu — ünïcode ✓"]:
        ids = tok.encode(text)
        assert tok.decode_text(ids) == text
        assert int(dm.token_bytes[ids].sum()) == len(text.encode("utf-8"))
    assert dm.token_bytes[:5].sum() == 0 and int(dm.token_bytes.max()) > 1  # merges span several bytes
    assert len(tok.encode(text)) < len(text.encode("utf-8"))
    assert all(isinstance(s, str) and s for s in dm.decode(torch.arange(dm.vocab_size)))


def test_bpe_cache_is_reused(trained, cache_dir, monkeypatch):
    dm, _ = trained
    folder = preprocessing.cache_path(dm.cfg)
    assert (folder / "tokenizer.json").exists()

    def no_training(*args, **kwargs):
        raise AssertionError("BPE trained again although the cache exists")

    monkeypatch.setattr(BpeTokenizer, "train", no_training)
    monkeypatch.setattr(preprocessing, "build", no_training)
    again = build_datamodule({**BPE, "cache_dir": cache_dir})
    again.setup()
    assert again.vocab_size == dm.vocab_size
    assert torch.equal(again.probe_batch()["input_ids"], dm.probe_batch()["input_ids"])
    assert preprocessing.cache_key(DataConfig.from_any({**BPE, "cache_dir": cache_dir, "vocab_size": 500})) \
        != preprocessing.cache_key(dm.cfg)
