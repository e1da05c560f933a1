"""The cache is read with pyarrow alone (`mhalab.data.arrow`) and gives exactly what `datasets`' torch format gives:
every split, example, batch and column, with the same dtypes; a job on a warm cache never imports `datasets`."""

import subprocess
import sys

import numpy as np
import pytest
import torch
from datasets import load_from_disk

from mhalab.data import DataConfig, preprocessing
from mhalab.data.arrow import load_splits

TASKS = {  # one of each kind of cached split: labelled (MQAR), classification, language modelling
    "mqar": {"task": "mqar", "mqar": {"n_train": 64, "n_val": 16, "n_test": 16}},
    "bbc_news": {"task": "bbc_news", "limit": 40, "max_len": 48},
    "bbc_news_mlm": {"task": "bbc_news_mlm", "limit": 40, "max_len": 48},
}


def same(a, b) -> None:
    assert isinstance(a, torch.Tensor) == isinstance(b, torch.Tensor)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    else:
        assert a == b


@pytest.mark.parametrize("task", TASKS)
def test_arrow_reader_gives_what_the_torch_format_of_datasets_gives(task, data_cache):
    cfg = DataConfig.from_any({**TASKS[task], "cache_dir": str(data_cache)})
    folder = preprocessing.prepare(cfg) / "dataset"
    theirs = {k: v.with_format("torch") for k, v in load_from_disk(str(folder)).items()}
    ours = load_splits(folder)
    assert list(ours) == list(theirs)
    for split, ds in theirs.items():
        mine = ours[split]
        assert len(mine) == len(ds) and mine.column_names == ds.column_names
        for i in (0, 1, len(ds) - 1, -1):
            for c in ds.column_names:
                same(mine[i][c], ds[i][c])
        batch, theirs_batch = mine[[3, 0, 2]], ds[[3, 0, 2]]
        for c in ds.column_names:
            for j in range(3):
                same(batch[c][j], theirs_batch[c][j])
        for c in ds.column_names:
            a, b = mine[c], ds[c]
            assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
        list_columns = [c for c in ds.column_names if ds.features[c].__class__.__name__ in ("List", "Sequence")]
        for c in list_columns:
            assert np.array_equal(mine.flat(c), np.concatenate([np.asarray(x) for x in ds[c]]))
    with pytest.raises(IndexError):
        ours["train"][len(ours["train"])]


@pytest.mark.proc
def test_a_job_on_a_warm_cache_does_not_import_datasets(data_cache):
    """Nor pandas, nor pyarrow.compute (~30 ms a process: the columns are read from their buffers)."""
    cfg = {**TASKS["mqar"], "cache_dir": str(data_cache)}
    preprocessing.prepare(DataConfig.from_any(cfg))
    code = ("import sys\nfrom mhalab.data import build_datamodule\n"
            f"dm = build_datamodule({cfg!r})\ndm.prepare_data(); dm.setup('fit')\n"
            "batch = next(iter(dm.train_dataloader())); dm.reference_levels()\n"
            "print(sorted(m for m in ('datasets', 'pandas', 'pyarrow.compute') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_columns_are_read_from_their_buffers_as_pyarrow_flattens_them():
    """Lists and numbers over several chunks, sliced chunks (their offsets index the whole child array) and large
    lists give pyarrow's own combine_chunks().flatten() and list lengths; a missing value or a string is refused."""
    import pyarrow as pa

    from mhalab.data.arrow import _column_values

    whole = pa.array([[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]], type=pa.list_(pa.int64()))
    cases = [pa.chunked_array([whole.slice(1, 2), whole.slice(0, 1), whole.slice(3)]),
             pa.chunked_array([pa.array([[1.5], [2.5, 3.5]], type=pa.large_list(pa.float32())),
                              pa.array([[]], type=pa.large_list(pa.float32()))],
                              type=pa.large_list(pa.float32())),
             pa.chunked_array([pa.array([3, 1], type=pa.int32()).slice(1), pa.array([7], type=pa.int32())])]
    for column in cases:
        values, lengths = _column_values(column)
        combined = column.combine_chunks()
        if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
            assert values.tolist() == combined.flatten().to_pylist()
            assert lengths.tolist() == [len(row) for row in combined.to_pylist()]
        else:
            assert values.tolist() == combined.to_pylist() and lengths is None
    assert _column_values(pa.chunked_array([pa.array([[1], None])])) is None
    assert _column_values(pa.chunked_array([pa.array([[1, None]])])) is None
    assert _column_values(pa.chunked_array([pa.array(["a"])])) is None
