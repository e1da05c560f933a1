"""Shared helpers: run `python -m mhalab.train` in a subprocess on tiny settings."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Tiny model and data so one run takes seconds on 2 CPU cores.
TINY = [
    "model.d_model=32", "model.n_layers=1", "model.d_ff=64", "attention.n_heads=2",
    "data.limit=64", "data.max_len=64", "data.batch_size=16",
    "trainer.max_epochs=1", "trainer.limit_train_batches=3", "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2", "trainer.enable_progress_bar=false", "trainer.num_sanity_val_steps=0",
    "logger=csv", "stats.every_n_steps=2", "stats.importance_batches=2", "optim.warmup_steps=1",
]


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory) -> Path:
    """One tokenized-data cache for the whole session."""
    return tmp_path_factory.mktemp("data_cache")


@pytest.fixture
def run_train(tmp_path, data_cache):
    """run_train(*overrides, env=None, multirun=False, tiny=True) -> CompletedProcess, in tmp_path."""

    def run(*overrides, env=None, multirun=False, tiny=True, timeout=300):
        args = [sys.executable, "-m", "mhalab.train"] + (["-m"] if multirun else [])
        args += (TINY if tiny else []) + [f"data.cache_dir={data_cache}"] + list(overrides)
        full_env = {**os.environ, "MHALAB_ROOT": str(tmp_path), "WANDB_SILENT": "true", **(env or {})}
        full_env.pop("MHALAB_RUN_ID", None)
        return subprocess.run(args, cwd=tmp_path, env=full_env, capture_output=True, text=True, timeout=timeout)

    return run


def summaries(root: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(root.rglob("summary.json"))]
