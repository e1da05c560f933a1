"""``data.path``: local CSV / TSV / JSON / JSONL / text / Parquet files, read with ``datasets.load_dataset``.

``path`` is one file, a list of files (all training data), or a mapping ``{train: ..., validation: ...,
test: ...}``.  Splits that are not given are carved out of train later (see ``splits.complete_splits``).
A text file (language modelling) is read one paragraph (blank-line separated) per document.
"""

from __future__ import annotations

import codecs
import os
from typing import Any

from datasets import DatasetDict, Value, load_dataset

from mhalab.data.paths import normalize_path
from mhalab.errors import ConfigError

BUILDERS = {
    ".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".txt": "text", ".text": "text",
    ".parquet": "parquet",
}
def builder_for(files: list[str]) -> str:
    """The ``load_dataset`` builder for the files' common extension."""
    builders = set()
    for f in files:
        ext = os.path.splitext(f)[1].lower()
        if ext not in BUILDERS:
            raise ConfigError(f"data.path file {f} has extension {ext!r}; allowed are {sorted(BUILDERS)}.")
        builders.add(BUILDERS[ext])
    if len(builders) > 1:
        raise ConfigError(f"data.path files {files} mix formats {sorted(builders)}; give files of one format.")
    return builders.pop()


def check_file(path: str, builder: str) -> None:
    """Raise ConfigError if ``path`` is missing, empty or (text formats) not UTF-8."""
    if not os.path.isfile(path):
        raise ConfigError(f"data.path file {path} does not exist.")
    if os.path.getsize(path) == 0:
        raise ConfigError(f"data.path file {path} is empty.")
    if builder == "parquet":
        return
    decoder = codecs.getincrementaldecoder("utf-8")()
    blank = True
    with open(path, "rb") as f:
        offset = 0
        while chunk := f.read(1 << 20):
            try:
                text = decoder.decode(chunk)
            except UnicodeDecodeError as e:
                raise ConfigError(
                    f"data.path file {path} is not UTF-8 (bad byte at offset {offset + e.start}); re-save it as UTF-8."
                ) from None
            blank = blank and not text.strip()
            offset += len(chunk)
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise ConfigError(f"data.path file {path} is not UTF-8 (it ends inside a character).") from None
    if blank:
        raise ConfigError(f"data.path file {path} is empty (only whitespace).")


def load_local(path: Any, text_column: str, label_column: str | None, hf_cache_dir: str) -> DatasetDict:
    """Load ``data.path`` into splits with the columns ``id``, ``text`` (and ``label`` when asked for)."""
    files = normalize_path(path)
    all_files = [f for fs in files.values() for f in fs]
    builder = builder_for(all_files)
    for f in all_files:
        check_file(f, builder)
    kwargs = {"csv": {"delimiter": "\t"} if all_files[0].lower().endswith(".tsv") else {},
              "text": {"sample_by": "paragraph"}}.get(builder, {})
    try:
        dd = load_dataset(builder, data_files=files, cache_dir=hf_cache_dir, **kwargs)
    except Exception as e:  # malformed CSV/JSON/Parquet: name the files, keep the parser's reason
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"data.path file(s) {all_files} could not be read as {builder} ({reason}).") from e
    out = {}
    for split, ds in dd.items():
        where = f"data.path file(s) {files[split]}"
        if len(ds) == 0:
            raise ConfigError(f"{where} hold no rows.")
        text_col = "text" if builder == "text" else text_column
        if text_col not in ds.column_names:
            raise ConfigError(
                f"{where} have no column {text_col!r} (data.text_column); columns are {ds.column_names}."
            )
        if ds.features[text_col] not in (Value("string"), Value("large_string")):
            raise ConfigError(
                f"{where}: column {text_col!r} (data.text_column) holds {ds.features[text_col]}, not text."
            )
        if any(t is None for t in ds[text_col]):
            raise ConfigError(f"{where}: column {text_col!r} (data.text_column) has empty cells; fill or drop them.")
        keep = {text_col: "text"}
        if label_column is not None:
            if label_column not in ds.column_names:
                raise ConfigError(
                    f"{where} have no column {label_column!r} (data.label_column); columns are {ds.column_names}."
                )
            keep[label_column] = "label"
        ds = ds.select_columns(list(keep)).rename_columns({k: v for k, v in keep.items() if k != v})
        ds = ds.add_column("id", [f"{split}-{i}" for i in range(len(ds))])
        out[split] = ds
    return DatasetDict(out)
