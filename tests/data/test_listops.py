"""ListOps: the evaluator, the generator and the data module."""

import os
import random
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import torch

from mhalab.data import build_datamodule
from mhalab.data import listops
from mhalab.data.listops import apply_op, evaluate, generate_listops

SMALL = {"max_depth": 5, "max_args": 6, "min_length": 10, "max_length": 60, "n_train": 600, "n_val": 100, "n_test": 100}


@pytest.mark.parametrize(
    "expression, value",
    [
        ("7", 7),
        ("[MAX 4 3 [MIN 2 3 ] 1 0 ]", 4),
        ("[MIN 5 [MAX 1 9 ] 7 ]", 5),
        ("[MED 3 1 2 ]", 2),
        ("[MED 1 2 ]", 1),  # even count: int(np.median) = int(1.5) = 1
        ("[MED 1 4 ]", 2),  # int(2.5) = 2
        ("[MED 9 2 7 4 ]", 5),  # middle values 4, 7 -> int(5.5) = 5
        ("[SM 5 6 7 ]", 8),  # 18 mod 10
        ("[SM 9 [SM 9 9 ] [MED 0 0 9 ] ]", 7),  # 9 + 8 + 0 = 17
        ("[MAX [MIN 9 8 [SM 1 1 ] ] [MED 6 [MAX 1 2 ] 4 5 ] ]", 4),  # MED 6 2 4 5 -> int(4.5)
    ],
)
def test_evaluate(expression, value):
    assert evaluate(expression) == value
    assert evaluate(expression.split()) == value


def test_med_matches_numpy_median():
    rng = random.Random(0)
    for _ in range(500):
        args = [rng.randrange(10) for _ in range(rng.randint(1, 10))]
        assert apply_op("[MED", args) == int(np.median(args))
        assert apply_op("[SM", args) == int(np.sum(args) % 10)


@pytest.mark.parametrize("bad", ["[MAX 1 2", "[MAX 1 2 ] ]", "1 2", "[MAX ]", "[FOO 1 ]", ""])
def test_evaluate_rejects_malformed(bad):
    with pytest.raises(ValueError):
        evaluate(bad)


def test_generator_deterministic_and_in_bounds():
    a = generate_listops(300, 7, 5, 6, 10, 60)
    assert a == generate_listops(300, 7, 5, 6, 10, 60)
    assert a != generate_listops(300, 8, 5, 6, 10, 60)
    assert len({t for t, _ in a}) == 300
    for text, label in a:
        assert 10 <= len(text.split()) <= 60
        assert label == evaluate(text)
        assert set(text.split()) <= set(listops.TOKENS)


@pytest.mark.proc
def test_generator_ignores_hash_randomisation():
    code = (
        "import runpy, sys; m = runpy.run_path(sys.argv[1]);"
        "print(repr(m['generate_listops'](50, 3, 5, 6, 10, 60)))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code, listops.__file__], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == repr(generate_listops(50, 3, 5, 6, 10, 60))


def test_datamodule(tmp_path):
    cfg = {"task": "listops", "cache_dir": str(tmp_path), "max_len": 64, "listops": SMALL}
    dm = build_datamodule(cfg)
    dm.setup()
    assert dm.vocab_size == 20 and dm.n_classes == 10 and dm.label_names == [str(d) for d in range(10)]
    assert dm.decode(list(range(20))) == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *listops.TOKENS]
    assert dm.token_bytes.tolist() == [0] * 5 + [4, 4, 4, 3, 1] + [1] * 10
    sizes = {s: len(ds) for s, ds in dm.datasets.items()}
    assert sizes == {"train": 600, "validation": 100, "test": 100}
    texts = {}
    for split, ds in dm.datasets.items():
        texts[split] = {tuple(ds[i]["input_ids"].tolist()) for i in range(len(ds))}
        assert len(texts[split]) == len(ds)
    assert not texts["train"] & texts["validation"] and not texts["train"] & texts["test"]
    assert not texts["validation"] & texts["test"]
    labels = Counter(int(y) for y in dm.datasets["train"]["label"])
    assert set(labels) == set(range(10))
    batch = next(iter(dm.train_dataloader()))
    x = batch["input_ids"]
    assert x.shape[1] <= 61 and bool((x[:, 0] == dm.cls_id).all())
    for row, pad, label in zip(x, batch["padding_mask"], batch["labels"]):
        assert evaluate(dm.decode(row[1:][~pad[1:]])) == int(label)
    again = build_datamodule(cfg)
    again.setup()
    assert torch.equal(again.probe_batch()["input_ids"], dm.probe_batch()["input_ids"])


def test_listops_max_length_must_fit(tmp_path):
    from mhalab.errors import ConfigError

    with pytest.raises(ConfigError, match="data.listops.max_length"):
        build_datamodule({"task": "listops", "cache_dir": str(tmp_path), "max_len": 32, "listops": SMALL})
