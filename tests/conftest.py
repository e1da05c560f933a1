"""Shared helpers: `mhalab train` on tiny settings, in this process (fast) or in a subprocess (for kills, signals
and DDP); an Architecture from flat sizes; the summaries under a folder."""

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mhalab.architecture import Architecture, AttentionConfig, ModelConfig

REPO = Path(__file__).resolve().parents[1]
# Tiny model and data so one run takes seconds on 2 CPU cores.
TINY = [
    "data=bbc_news",  # topic classification (the default job is language modelling)
    "model.d_model=32", "model.n_layers=1", "model.d_ff=64", "attention.n_heads=2",
    "data.limit=64", "data.max_len=64", "data.batch_size=16",
    "trainer.max_epochs=1", "trainer.limit_train_batches=3", "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2", "trainer.enable_progress_bar=false", "trainer.num_sanity_val_steps=0",
    "logger=csv", "stats.every_n_steps=2", "stats.importance_batches=2", "optim.warmup_steps=1",
    "stats.plots=false",  # drawing takes longer than a tiny run; the tests of pictures turn it on
]


def said(stderr: str) -> list[str]:
    """What a refused command said: stderr's lines, less blank ones and a long sweep check's progress lines (printed
    when checking its jobs takes seconds, as on a loaded machine)."""
    from mhalab.runs.preflight import CHECKING

    return [ln for ln in stderr.strip().splitlines() if ln.strip() and not ln.startswith(CHECKING)]


def refusal(r) -> str:
    """The one sentence a refused `mhalab` command printed (`r`: a CompletedProcess or the `train` fixture's result):
    exit 2, one stderr line starting `error: ` (`said`), no traceback."""
    lines = said(r.stderr)
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr, \
        f"exit {r.returncode}\n{r.stderr[-3000:]}"
    return lines[0]


def slow_except(values, keep, key=lambda v: v):
    """Parameters for a test whose variants repeat one promise: those whose key is in `keep` run in the default
    suite, the others are marked slow (`pytest -m slow`, which CI runs after it), so the default run stays short on
    a slow 2-core machine and still checks every promise once."""
    return [pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=() if key(v) in keep else pytest.mark.slow)
            for v in values]


@pytest.fixture(autouse=True)
def no_grants(monkeypatch):
    """Each test starts with no package granted (`mhalab.targets.grant` sets MHALAB_ALLOW for the process)."""
    monkeypatch.delenv("MHALAB_ALLOW", raising=False)


@pytest.fixture(autouse=True)
def _torch_threads():
    """A test that sets torch's thread count in this process (`torch_threads=1`, `mhalab bench ... threads=1`) leaves
    the tests after it in the same worker as it found them: with one thread instead of two, a run's head statistics
    move in the 7th digit, and tests/runs/test_resume.py compares an in-process run with a subprocess bit for bit."""
    import torch

    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def _starts_python(args) -> bool:
    """Whether a subprocess' command line starts Python: `mhalab`, `python -m ...`, a script (torch's import alone
    takes seconds); short programs a library runs on its own (`uname -p`, wandb's service) do not count."""
    first = os.fsdecode(args if isinstance(args, (str, bytes, os.PathLike)) else args[0])
    return first == sys.executable or os.path.basename(first).startswith(("python", "mhalab"))


@pytest.fixture(autouse=True)
def _proc_marked(request, monkeypatch):
    """A test that starts a Python process (a real `mhalab` command, a script) carries the `proc` marker, so that
    `pytest tests/<room> -m "not proc"` runs a room's fast tests; an unmarked one fails here, saying so."""
    if request.node.get_closest_marker("proc"):
        yield
        return
    started = []
    init = subprocess.Popen.__init__

    def watched(self, args, *a, **kw):
        if _starts_python(args):
            started.append(args)
        init(self, args, *a, **kw)

    monkeypatch.setattr(subprocess.Popen, "__init__", watched)
    yield
    if started:
        pytest.fail(f"{request.node.nodeid} starts a Python process ({started[0]!r}): mark it @pytest.mark.proc "
                    "(docs/testing.md)", pytrace=False)


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory) -> Path:
    """One tokenized-data cache for the whole session."""
    return tmp_path_factory.mktemp("data_cache")


class Result:
    """What a `mhalab train` command left: its exit status and everything it printed."""

    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def train(tmp_path, data_cache, capfd):
    """train(*overrides, multirun=False, tiny=True, root=tmp_path, flags=()) -> Result: `mhalab train` in this
    process, with its run directories under root/logs (paths.root_dir) and the session's data cache."""
    from mhalab.training.train import main

    def run(*overrides, multirun=False, tiny=True, root=None, flags=()):
        argv = (["-m"] if multirun else []) + list(flags) + (TINY if tiny else []) + [
            f"paths.root_dir={root or tmp_path}", f"data.cache_dir={data_cache}", *overrides]
        capfd.readouterr()
        try:
            main(argv)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        out, err = capfd.readouterr()
        return Result(code, out, err)

    return run


@pytest.fixture
def run_train(tmp_path, data_cache):
    """run_train(*overrides, env=None, multirun=False, tiny=True, command=None) -> CompletedProcess, in tmp_path;
    `command` replaces `python -m mhalab.training.train` (e.g. the installed `mhalab train`)."""

    def run(*overrides, env=None, multirun=False, tiny=True, timeout=300, command=None):
        args = (command or [sys.executable, "-m", "mhalab.training.train"]) + (["-m"] if multirun else [])
        args += (TINY if tiny else []) + [f"data.cache_dir={data_cache}"] + list(overrides)
        full_env = {**os.environ, "MHALAB_ROOT": str(tmp_path), "WANDB_SILENT": "true", **(env or {})}
        full_env.pop("MHALAB_RUN_ID", None)
        return subprocess.run(args, cwd=tmp_path, env=full_env, capture_output=True, text=True, timeout=timeout)

    return run


MODEL_KEYS = {f.name for f in dataclasses.fields(ModelConfig)}
ATTENTION_KEYS = {f.name for f in dataclasses.fields(AttentionConfig)}


def arch(vocab_size: int = 50, objective: str = "classification", n_classes: int | None = None, **sizes) -> Architecture:
    """An Architecture from flat sizes: model keys (d_model, pos, ...) and attention keys (n_heads, d_head, ...);
    `attn_dropout` is attention.dropout."""
    model = {k: v for k, v in sizes.items() if k in MODEL_KEYS}
    attention = {k: v for k, v in sizes.items() if k in ATTENTION_KEYS and k != "dropout"}
    if "attn_dropout" in sizes:
        attention["dropout"] = sizes["attn_dropout"]
    unknown = set(sizes) - MODEL_KEYS - ATTENTION_KEYS - {"attn_dropout"}
    assert not unknown, unknown
    if objective == "classification" and n_classes is None:
        n_classes = 3
    return Architecture(vocab_size, objective, n_classes, ModelConfig(**model), AttentionConfig(**attention))


def proc_env() -> dict[str, str]:
    """The environment a test's `mhalab` process runs in: wandb quiet, no grant of the tester's shell."""
    env = {**os.environ, "WANDB_SILENT": "true"}
    env.pop("MHALAB_ALLOW", None)
    return env


def wait_for(found, what: str, timeout: float = 240):
    """Poll `found()` until it returns something true; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = found()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def session(sid: int) -> dict[int, str]:
    """{pid: name} of the live processes of session `sid` (zombies left out), read from /proc."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) == sid and fields[0] not in "ZX":  # fields: state, ppid, pgrp, session
            found[int(entry)] = name
    return found


def compositions(profile: Path) -> int:
    """How many configs a cProfiled process composed (every composition goes through Hydra's load_configuration)."""
    import pstats

    return sum(v[1] for k, v in pstats.Stats(str(profile)).stats.items()
               if k[2] == "load_configuration" and k[0].endswith("config_loader_impl.py"))


def summaries(root: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(root.rglob("summary.json"))]


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory, data_cache) -> list[Path]:
    """Two seeds of a tiny 2-layer, 4-head masked LM, trained once per session (ablate, convert and plots read
    them): their run directories."""
    from mhalab.training.train import main

    root = tmp_path_factory.mktemp("tiny_runs")
    try:
        main(["-m", *TINY, "data=bbc_news_mlm", "attention.n_heads=4", "model.n_layers=2", "stats.plots=false",
              "seed=0,1", f"paths.root_dir={root}", f"data.cache_dir={data_cache}"])
    except SystemExit as e:
        assert not e.code, e.code
    runs = sorted((p.parent for p in root.rglob("summary.json")), key=lambda d: int(d.name))
    assert len(runs) == 2
    return runs
