"""The tokenized-data cache cannot lie: content keys, a checked manifest, rebuilds, stale folders, locks, full disks.

Tiny data throughout: a 40-row CSV through data.path (or a 5-file fake BBC corpus for the key).
"""

import dataclasses
import errno
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mhalab import locks
from mhalab.data import DataConfig, bbc_news, build_datamodule, cache, preprocessing

SRC = Path(preprocessing.__file__).resolve().parents[2]
ARROW = "dataset/train/data-00000-of-00001.arrow"


def write_csv(path: Path, word: str = "headline", n: int = 40) -> str:
    pd.DataFrame([{"text": f"{word} number {i} about topic {i % 4}", "label": i % 4} for i in range(n)]).to_csv(
        path, index=False
    )
    return str(path)


@pytest.fixture
def csv(tmp_path) -> str:
    return write_csv(tmp_path / "news.csv")


def config(tmp_path, csv, **overrides) -> DataConfig:
    return DataConfig.from_any({"task": "ag_news", "path": csv, "cache_dir": str(tmp_path / "cache"), "max_len": 32,
                                **overrides})


def ids(cfg: DataConfig) -> dict[str, list[list[int]]]:
    """Every split's token ids, read the way training reads them (through the data module)."""
    dm = build_datamodule(cfg)
    dm.prepare_data()
    dm.setup()
    return {split: [x.tolist() for x in ds["input_ids"]] for split, ds in dm.datasets.items()}


def tmp_folders(cfg: DataConfig) -> list[str]:
    return sorted(p.name for p in (Path(cfg.cache_dir) / "mhalab_data").glob("*.tmp-*"))


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == cache.__name__ and r.levelno == logging.WARNING]


# -- the key ---------------------------------------------------------------------------------------------
def test_key_holds_every_field_but_the_loader_only_ones(tmp_path, csv):
    names = {f.name for f in dataclasses.fields(DataConfig)}
    assert preprocessing.LOADER_ONLY < names
    cfg = config(tmp_path, csv)
    assert set(preprocessing.key_parts(cfg)["settings"]) == names - preprocessing.LOADER_ONLY
    loader_only = {"batch_size": 7, "num_workers": 3, "mlm_probability": 0.3, "hf_cache_dir": str(tmp_path / "hf")}
    assert preprocessing.cache_key(config(tmp_path, csv, **loader_only)) == preprocessing.cache_key(cfg)
    assert preprocessing.cache_key(config(tmp_path, csv, limit=5)) != preprocessing.cache_key(cfg)

    @dataclasses.dataclass
    class Later(DataConfig):  # a field added to DataConfig later is in the key without touching the cache code
        new_setting: int = 1

    base = {"task": "ag_news", "path": csv, "cache_dir": str(tmp_path / "cache")}
    assert preprocessing.cache_key(Later.from_any({**base, "new_setting": 2})) != \
        preprocessing.cache_key(Later.from_any(base))


def test_key_follows_the_bbc_corpus_content(tmp_path, monkeypatch):
    root = tmp_path / "corpus"
    for topic in bbc_news.LABEL_NAMES:
        (root / topic).mkdir(parents=True)
        (root / topic / "001.txt").write_text(f"an article about {topic}")
    monkeypatch.setattr(bbc_news, "corpus_dir", lambda: root)
    cfg = DataConfig.from_any({"task": "bbc_news", "cache_dir": str(tmp_path / "cache")})
    before = preprocessing.cache_key(cfg)
    (root / "tech" / "001.txt").write_text("an article about hech")
    assert preprocessing.cache_key(cfg) != before


def test_hub_task_key_names_repo_and_config(tmp_path):
    cfg = DataConfig.from_any({"task": "wikitext2", "cache_dir": str(tmp_path)})
    task = preprocessing.key_parts(cfg)["task"]
    assert (task["hub_repo"], task["hub_config"]) == ("Salesforce/wikitext", "wikitext-2-raw-v1")


def test_edit_keeping_size_and_mtime_gives_new_key_and_fresh_data(tmp_path, csv):
    cfg = config(tmp_path, csv)
    old_folder, old_ids = preprocessing.cache_path(cfg), ids(cfg)
    st = os.stat(csv)
    write_csv(Path(csv), word="HEADLINE")  # same length
    os.utime(csv, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (os.stat(csv).st_size, os.stat(csv).st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert preprocessing.cache_path(cfg) != old_folder
    new_ids = ids(cfg)
    first = bytes(i - 5 for i in new_ids["test"][0][1:]).decode()
    assert first.startswith("HEADLINE") and new_ids != old_ids


# -- damage is found and repaired ------------------------------------------------------------------------
def flip_an_id(folder: Path) -> None:
    """Flip the low bit of one token id inside the train arrow file (a silent change of the data)."""
    arrow = folder / ARROW
    raw = bytearray(arrow.read_bytes())
    from datasets import load_from_disk

    first = load_from_disk(str(folder / "dataset"))["train"][0]["input_ids"]
    at = bytes(raw).find(np.asarray(first[:4], dtype=np.int32).tobytes())
    assert at > 0
    raw[at + 4] ^= 1
    arrow.write_bytes(bytes(raw))


DAMAGE = {
    "truncated arrow": (lambda f: (f / ARROW).write_bytes((f / ARROW).read_bytes()[:500]),
                        f"{ARROW} has 500 bytes instead of"),
    "flipped id": (flip_an_id, f"{ARROW} does not match its sha256"),
    "missing manifest": (lambda f: (f / "manifest.json").unlink(), "manifest.json is missing"),
    "unreadable manifest": (lambda f: (f / "manifest.json").write_text('{"key": '), "manifest.json is unreadable"),
    "missing meta": (lambda f: (f / "meta.json").unlink(), "meta.json is missing"),
    "missing dataset": (lambda f: shutil.rmtree(f / "dataset"), "dataset/ is missing"),
    "missing state": (lambda f: (f / "dataset/validation/state.json").unlink(),
                      "dataset/validation/state.json is missing"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damage_is_logged_once_and_rebuilt_to_the_same_ids(damage, tmp_path, csv, caplog):
    cfg = config(tmp_path, csv)
    fresh = ids(cfg)
    folder = preprocessing.cache_path(cfg)
    harm, reason = DAMAGE[damage]
    harm(folder)
    with caplog.at_level(logging.WARNING, logger=cache.__name__):
        assert ids(cfg) == fresh
        (message,) = warnings(caplog)
        assert message.startswith(f"data cache {folder} is damaged ({reason}") and message.endswith("); rebuilding it")
        caplog.clear()
        assert ids(cfg) == fresh and warnings(caplog) == []  # repaired for good
    assert cache.problem(folder, preprocessing.key_parts(cfg)) is None
    assert tmp_folders(cfg) == []


def test_swapped_tokenizer_is_rebuilt(tmp_path, csv, caplog):
    cfg = config(tmp_path, csv, tokenizer="bpe", vocab_size=300)
    fresh = ids(cfg)
    other = config(tmp_path, csv, tokenizer="bpe", vocab_size=280)
    preprocessing.prepare(other)
    folder = preprocessing.cache_path(cfg)
    shutil.copy(preprocessing.cache_path(other) / "tokenizer.json", folder / "tokenizer.json")
    with caplog.at_level(logging.WARNING, logger=cache.__name__):
        dm = build_datamodule(cfg)
        dm.setup()
    assert len(warnings(caplog)) == 1 and "(tokenizer.json " in warnings(caplog)[0]
    assert dm.vocab_size == 300 and {s: [x.tolist() for x in d["input_ids"]] for s, d in dm.datasets.items()} == fresh


def test_a_run_verifies_the_cache_once(tmp_path, csv, monkeypatch):
    """prepare_data (called by mhalab.training.train and again by Lightning) and setup check the manifest once in all."""
    cfg = config(tmp_path, csv)
    preprocessing.prepare(cfg)  # built by an earlier process
    checks = []
    real = cache.problem
    monkeypatch.setattr(cache, "problem", lambda *a, **k: checks.append(1) or real(*a, **k))
    dm = build_datamodule(cfg)
    dm.prepare_data()
    dm.setup("fit")
    dm.prepare_data()
    assert len(checks) == 1 and dm.datasets is not None


def test_load_cached_refuses_another_configs_folder(tmp_path, csv):
    cfg = config(tmp_path, csv)
    folder = preprocessing.prepare(config(tmp_path, csv, max_len=16))
    with pytest.raises(ValueError, match="not the cache folder"):
        preprocessing.load_cached(cfg, folder)


# -- interrupted writes and concurrent writers -----------------------------------------------------------
def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert not locks.pid_alive(proc.pid)
    return proc.pid


@pytest.mark.proc
def test_stale_tmp_of_dead_pid_removed_live_kept(tmp_path, csv):
    cfg = config(tmp_path, csv)
    folder = preprocessing.cache_path(cfg)
    folder.parent.mkdir(parents=True)
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # a live writer
    try:
        dead, live = (folder.with_name(f"{folder.name}.tmp-{pid}") for pid in (dead_pid(), writer.pid))
        other_dead = folder.parent / f"bbc_news-0123456789abcdef.tmp-{dead_pid()}"
        for tmp in (dead, live, other_dead):
            (tmp / "out").mkdir(parents=True)
            (tmp / "out" / "half.arrow").write_bytes(b"\0" * 10)
        with cache.locked(folder.parent / "bbc_news-0123456789abcdef"):  # a writer on another host holds its lock
            cache.remove_stale(folder.parent)
            assert tmp_folders(cfg) == sorted([live.name, other_dead.name])
        preprocessing.prepare(cfg)  # a start: stale folders go, the live process's stays
        assert tmp_folders(cfg) == [live.name] and (live / "out" / "half.arrow").exists()
    finally:
        writer.kill()
        writer.wait()


CHILD = textwrap.dedent("""
    import json, os, resource, signal, sys, time, types
    from pathlib import Path
    import mhalab  # mhalab.data without its __init__ (which imports Lightning: seconds per process)
    pkg = types.ModuleType("mhalab.data")
    pkg.__path__ = [str(Path(mhalab.__file__).parent / "data")]
    sys.modules["mhalab.data"] = pkg
    from mhalab.data import preprocessing
    from mhalab.data.config import DataConfig

    mode, cfg, work = sys.argv[1], DataConfig.from_any(json.loads(sys.argv[2])), Path(sys.argv[3])
    if mode == "race":
        build = preprocessing.build
        def slow_build(c, scratch):
            with open(work / "builds.log", "a") as f:
                f.write(f"{os.getpid()}\\n")
            time.sleep(1.0)
            return build(c, scratch)
        preprocessing.build = slow_build
        (work / f"ready-{os.getpid()}").touch()
        deadline = time.time() + 60
        while len(list(work.glob("ready-*"))) < 2 and time.time() < deadline:
            time.sleep(0.01)
        folder = preprocessing.prepare(cfg)
        data, _, _ = preprocessing.load_cached(cfg, folder)
        ids = {s: [list(map(int, x)) for x in d["input_ids"]] for s, d in data.items()}
        print(json.dumps({"folder": str(folder), "ids": ids}))
    else:  # fsize: a file size limit stands in for a full disk
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        try:
            preprocessing.prepare(cfg)
        except OSError as e:
            print(json.dumps({"type": type(e).__name__, "errno": e.errno, "filename": e.filename, "text": str(e)}))
""")


def run_children(tmp_path, mode: str, cfg: DataConfig, n: int) -> list[str]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    node = json.dumps({k: v for k, v in dataclasses.asdict(cfg).items()})
    procs = [subprocess.Popen([sys.executable, str(script), mode, node, str(tmp_path)], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(n)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    return [out.strip().splitlines()[-1] for out, _ in outs]


@pytest.mark.proc
def test_two_processes_preparing_at_once_build_once(tmp_path, csv):
    cfg = config(tmp_path, csv)
    first, second = (json.loads(line) for line in run_children(tmp_path, "race", cfg, 2))
    assert len((tmp_path / "builds.log").read_text().split()) == 1  # the second waited, re-checked and used it
    assert first == second and first["folder"] == str(preprocessing.cache_path(cfg))
    assert cache.problem(Path(first["folder"]), preprocessing.key_parts(cfg)) is None
    assert tmp_folders(cfg) == []


# -- full disk -------------------------------------------------------------------------------------------
def test_full_disk_names_the_folder_and_leaves_nothing(tmp_path, csv, monkeypatch):
    from datasets import DatasetDict

    cfg = config(tmp_path, csv)
    folder = preprocessing.cache_path(cfg)

    def full(self, path, **kwargs):
        Path(path).mkdir(parents=True)
        (Path(path) / "data-00000-of-00001.arrow").write_bytes(b"\0" * 100)  # half-written
        raise OSError(errno.ENOSPC, "No space left on device")  # like pyarrow: no filename

    monkeypatch.setattr(DatasetDict, "save_to_disk", full)
    with pytest.raises(OSError) as info:
        preprocessing.prepare(cfg)
    e = info.value
    assert e.errno == errno.ENOSPC and e.filename == f"{folder}.tmp-{os.getpid()}/out"
    assert "free space or set paths.cache_dir" in str(e) and "No space left on device" in str(e)
    assert not folder.exists() and tmp_folders(cfg) == []
    monkeypatch.undo()
    assert preprocessing.prepare(cfg) == folder  # nothing poisoned for the next run


def test_full_disk_keeps_the_failing_files_name(tmp_path, csv, monkeypatch):
    cfg = config(tmp_path, csv)

    def full(folder, parts):
        raise OSError(errno.ENOSPC, "No space left on device", str(folder / "manifest.json"))

    monkeypatch.setattr(cache, "write_manifest", full)
    with pytest.raises(cache.CacheWriteError) as info:
        preprocessing.prepare(cfg)
    assert info.value.filename.endswith(f".tmp-{os.getpid()}/out/manifest.json")
    assert tmp_folders(cfg) == [] and not preprocessing.cache_path(cfg).exists()


@pytest.mark.proc
def test_file_size_limit_in_a_subprocess(tmp_path):
    cfg = DataConfig.from_any({"task": "bbc_news", "tokenizer": "byte", "limit": 40, "cache_dir": str(tmp_path / "c")})
    (line,) = run_children(tmp_path, "fsize", cfg, 1)
    result = json.loads(line)
    folder = preprocessing.cache_path(cfg)
    assert result["type"] == "CacheWriteError" and result["errno"] == errno.EFBIG
    assert result["filename"].startswith(str(folder)) and "paths.cache_dir" in result["text"]
    assert not folder.exists() and tmp_folders(cfg) == []
