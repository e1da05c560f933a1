"""A cached split read with pyarrow alone, indexed as `datasets`' torch format indexes it.

The cache is written by `DatasetDict.save_to_disk` (`preprocessing`); reading it back through `datasets` costs its
import (pandas, pyarrow, huggingface_hub: about a second of CPU), which every job of a sweep would pay again. This
reader gives the datamodule what it uses of a torch-formatted `datasets.Dataset`: `len`, `column_names`, `data`
(the Arrow table), an example by index (`{column: tensor}`), a batch by a list of indices (`{column: [tensor, ...]}`)
and a whole column by name. Integers become int64 tensors, floats float32, strings stay strings, as there.

A split whose every column holds numbers or lists of one length (MQAR, the synthetic tasks) fits in memory as one
tensor a column (`MAX_STACKED` values at most): a batch is then rows of those tensors, not examples read one by one
from Arrow (the same values, some 100x faster).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

NUMPY = {pa.int32(): np.int32, pa.int64(): np.int64, pa.float32(): np.float32, pa.float64(): np.float64}
MAX_STACKED = 1 << 25  # values of a split held as stacked tensors (256 MiB of int64)


def load_splits(folder: Path) -> dict[str, "ArrowSplit"]:
    """Every split of a `save_to_disk` folder (`dataset_dict.json` lists them)."""
    folder = Path(folder)
    names = json.loads((folder / "dataset_dict.json").read_text())["splits"]
    return {name: ArrowSplit(folder / name) for name in names}


class ArrowSplit:
    """One split: the Arrow files its `state.json` lists, memory-mapped and read as one table."""

    def __init__(self, folder: Path):
        files = json.loads((Path(folder) / "state.json").read_text())["_data_files"]
        tables = [pa.ipc.open_stream(pa.memory_map(str(Path(folder) / f["filename"]))).read_all() for f in files]
        self.data = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        self.column_names = list(self.data.column_names)
        self._stacked: dict[str, torch.Tensor] | None = None  # {column: (N, ...) tensor}, read at the first batch
        self._stackable: bool | None = None

    def __len__(self) -> int:
        return self.data.num_rows

    def __getitem__(self, key):
        if isinstance(key, str):  # a whole column
            return _column([_tensor(v) for v in self.data.column(key).to_pylist()])
        if isinstance(key, (list, tuple)):  # a batch: {column: [value per example]}
            rows = self.rows(key)
            if rows is not None:
                return {name: list(t.unbind(0)) for name, t in rows.items()}
            rows = [self[i] for i in key]
            return {name: [row[name] for row in rows] for name in self.column_names}
        if key < 0:
            key += len(self)
        if not 0 <= key < len(self):
            raise IndexError(f"index {key} is out of range for a split of {len(self)} examples")
        row = self.data.slice(key, 1).to_pydict()  # (Table.take would import pandas)
        return {name: _tensor(values[0]) for name, values in row.items()}

    def stacked(self) -> dict[str, torch.Tensor] | None:
        """{column: (N,) or (N, T) tensor} when every column holds numbers or lists of numbers of one length T and
        the split has at most MAX_STACKED values; else None. Read once, then kept."""
        if self._stackable is None:
            self._stacked = _stack_columns(self.data)
            self._stackable = self._stacked is not None
        return self._stacked

    def rows(self, indices) -> dict[str, torch.Tensor] | None:
        """{column: (len(indices), ...) tensor} of these examples when the split is `stacked`, else None."""
        stacked = self.stacked()
        if stacked is None:
            return None
        index = torch.as_tensor(indices, dtype=torch.long)  # (B,)
        return {name: t[index] for name, t in stacked.items()}

    def flat(self, column: str) -> np.ndarray:
        """Every value of a list column, as one array read from the Arrow buffers (no copy row by row)."""
        got = _column_values(self.data.column(column))
        if got is None or got[1] is None:
            raise ValueError(f"column {column!r} is not a list of numbers without missing values")
        return got[0]


def _stack_columns(table: pa.Table) -> dict[str, torch.Tensor] | None:
    """Every column as one tensor, typed as `_tensor` types a value (int64, float32), or None (see `stacked`)."""
    out, n = {}, table.num_rows
    for name in table.column_names:
        got = _column_values(table.column(name))
        if got is None:
            return None
        values, lengths = got
        if lengths is not None and (n == 0 or (lengths != lengths[0]).any()):
            return None
        if len(values) > MAX_STACKED:
            return None
        t = torch.from_numpy(values.astype(np.float32 if values.dtype.kind == "f" else np.int64))  # a copy
        out[name] = t.view(n, int(lengths[0])) if lengths is not None else t
    return out


def _column_values(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray | None] | None:
    """A column of numbers, or of lists of numbers, as (every value in row order, each row's length; None for a
    column of numbers); None when it holds anything else or a missing value. Read from the buffers chunk by chunk
    (not to_numpy: it would import pandas; not combine_chunks or flatten: they import pyarrow.compute, ~30 ms)."""
    listed = pa.types.is_list(column.type) or pa.types.is_large_list(column.type)
    item = column.type.value_type if listed else column.type
    if item not in NUMPY or column.null_count:
        return None
    values, lengths = [], []
    for chunk in column.chunks:
        if len(chunk) == 0:
            continue
        if not listed:
            values.append(_numbers(chunk))
            continue
        offsets = np.frombuffer(chunk.buffers()[1], dtype=np.int64 if pa.types.is_large_list(chunk.type) else np.int32)
        offsets = offsets[chunk.offset:chunk.offset + len(chunk) + 1]  # (rows + 1,) into the whole child array
        if chunk.values.null_count:
            return None
        values.append(_numbers(chunk.values)[offsets[0]:offsets[-1]])
        lengths.append(np.diff(offsets))
    return _joined(values, NUMPY[item]), _joined(lengths, np.int64) if listed else None


def _joined(parts: list[np.ndarray], dtype) -> np.ndarray:
    """The parts end to end (the one part itself when there is one: no copy)."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.empty(0, dtype)


def _numbers(array: pa.Array) -> np.ndarray:
    """A numeric array without missing values, as a view of its Arrow buffer (no copy)."""
    return np.frombuffer(array.buffers()[1], dtype=NUMPY[array.type])[array.offset:array.offset + len(array)]


def _tensor(value):
    """A value as the torch format gives it: numbers and lists of numbers as tensors, anything else as it is."""
    if isinstance(value, str) or value is None:
        return value
    t = torch.tensor(value)
    return t.to(torch.float32) if t.is_floating_point() else t


def _column(values: list):
    """A whole column: one stacked tensor when every value is a tensor of one shape, else the list."""
    if values and all(isinstance(v, torch.Tensor) for v in values) and len({v.shape for v in values}) == 1:
        return torch.stack(values)
    return values
