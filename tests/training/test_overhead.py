"""What removes a run's per-step and per-job overhead (issue 26) changes no result: batches read as whole columns are
the batches read example by example; an all-False padding mask is dropped without changing a bit; train/acc counts
what `batch_sums` counts; CPU reseeding draws what `torch.manual_seed` draws; the sanity check is skipped only when a
validation follows within known steps; a final state that ties with the best is tested in memory. And
`mhalab bench overhead` runs a real job against its plain loop and reports what it measured."""

import json
import statistics
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mhalab.data import DataConfig, build_datamodule, preprocessing
from mhalab.data.arrow import load_splits
from mhalab.data.sampling import Columns, EpochIndexed
from conftest import arch as arch_of

MQAR = {"task": "mqar", "mqar": {"n_train": 96, "n_val": 16, "n_test": 16}, "batch_size": 8}


def test_whole_column_batches_are_the_example_by_example_batches(data_cache):
    cfg = {**MQAR, "cache_dir": str(data_cache)}
    dm = build_datamodule(cfg, seed=3)
    dm.prepare_data()
    dm.setup("fit")
    train = dm.datasets["train"]
    assert train.stacked() is not None
    loader = dm.train_dataloader()
    assert loader.dataset.whole_batches
    fast = list(loader)
    loader.dataset.whole_batches = False  # the same loader, examples read one by one from Arrow and padded
    slow = list(loader)
    assert len(fast) == len(slow) == 96 // 8
    for a, b in zip(fast, slow):
        assert a.keys() == b.keys() == {"input_ids", "padding_mask", "labels"}
        for k in a:
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    rows = train.rows([5, 0, 7])
    for name, column in rows.items():
        for j, i in enumerate([5, 0, 7]):
            assert torch.equal(column[j], train[i][name])
    assert isinstance(EpochIndexed(train, whole_batches=True).__getitems__([(0, 1), (0, 2)]), Columns)


def test_a_split_of_sequences_of_several_lengths_is_read_example_by_example(tmp_path):
    from datasets import Dataset, DatasetDict

    DatasetDict({"train": Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5], [6]], "label": [0, 1, 0]})}
                ).save_to_disk(str(tmp_path))
    split = load_splits(tmp_path)["train"]
    assert split.stacked() is None and split.rows([0, 1]) is None
    batch = split[[2, 0]]
    assert [t.tolist() for t in batch["input_ids"]] == [[6], [1, 2, 3]] and batch["label"][1].dtype == torch.int64
    assert not isinstance(EpochIndexed(split, whole_batches=True).__getitems__([0, 1]), Columns)


@pytest.mark.parametrize("causal", [False, True])
def test_an_all_false_padding_mask_is_dropped_without_changing_a_bit(causal):
    from mhalab.training.module import AttentionLitModule

    arch = arch_of(vocab_size=40, d_model=32, n_heads=4, n_layers=2, dropout=0.0, attn_dropout=0.0,
                   objective="clm" if causal else "mlm")
    torch.manual_seed(0)
    module = AttentionLitModule(arch.to_dict(), {"lr": 1e-3})
    ids = torch.randint(5, 40, (3, 12))
    batch = {"input_ids": ids, "padding_mask": torch.zeros(3, 12, dtype=torch.bool), "labels": ids}
    dm = build_datamodule({"task": "mqar"})
    dropped = dm.on_before_batch_transfer(batch, 0)
    assert "padding_mask" not in dropped
    padded = {**batch, "padding_mask": batch["padding_mask"].clone()}
    padded["padding_mask"][1, -2:] = True
    assert dm.on_before_batch_transfer(padded, 0) is padded  # something is padded: kept

    def run(b):
        module.zero_grad()
        logits, labels = module.logits_and_labels(b, training=True)
        torch.nn.functional.cross_entropy(logits, labels).backward()
        return logits.detach(), [p.grad.clone() for p in module.parameters()]

    (la, ga), (lb, gb) = run(batch), run(dropped)
    assert torch.equal(la, lb) and all(torch.equal(a, b) for a, b in zip(ga, gb))


def test_train_accuracy_counts_what_batch_sums_counts():
    from mhalab.training.evaluation import batch_correct, batch_sums

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(50, 7, generator=g)
    labels = torch.randint(0, 7, (50,), generator=g)
    labels[::3] = -100
    full, cheap = batch_sums(logits, labels), batch_correct(logits, labels)
    assert cheap.dtype == torch.float64 and torch.equal(cheap[1:3], full[1:3]) and cheap[0] == cheap[3] == 0


def test_cpu_reseeding_draws_what_torch_manual_seed_draws():
    from mhalab.training.callbacks import seed_all

    seed_all(1234)
    a = (random.random(), np.random.rand(), torch.rand(3), torch.nn.functional.dropout(torch.ones(8), 0.5))
    random.seed(1234)
    np.random.seed(1234)
    torch.manual_seed(1234)
    b = (random.random(), np.random.rand(), torch.rand(3), torch.nn.functional.dropout(torch.ones(8), 0.5))
    assert a[:2] == b[:2] and torch.equal(a[2], b[2]) and torch.equal(a[3], b[3])


def _trainer_cfg(**trainer):
    base = {"max_steps": -1, "min_epochs": 1, "check_val_every_n_epoch": 1, "val_check_interval": 1.0,
            "num_sanity_val_steps": 2, "enable_progress_bar": False}
    return base | trainer


@pytest.mark.parametrize("trainer, sanity", [
    ({}, 2),  # validated once an epoch: the sanity check runs first
    ({"max_steps": 100}, 0),  # the closing validation follows at step 100
    ({"check_val_every_n_epoch": None, "val_check_interval": 200}, 0),  # validated every 200 steps
    ({"check_val_every_n_epoch": None, "val_check_interval": 0.5}, 2),  # a fraction of an epoch
])
def test_the_sanity_check_is_skipped_only_when_a_validation_follows_within_known_steps(trainer, sanity, monkeypatch):
    import dataclasses

    from mhalab.training import fit as T

    fields = _trainer_cfg(**trainer)
    monkeypatch.setattr(dataclasses, "asdict", lambda t: dict(fields, profiler=None))
    tc = SimpleNamespace(trainer=SimpleNamespace(**fields), endpoint=SimpleNamespace(stop_at_threshold=False))
    assert T._trainer_kwargs(tc)["num_sanity_val_steps"] == sanity


def test_a_final_state_that_ties_with_the_best_at_float32_is_tested_in_memory(tmp_path):
    from mhalab.training.fit import _test_checkpoint

    last, best_path = tmp_path / "last.ckpt", tmp_path / "best.ckpt"
    final = 3.4783359718322755  # float64; the checkpoint callback keeps float32(final)
    best = SimpleNamespace(best_model_path=str(best_path), best_model_score=torch.tensor(final, dtype=torch.float32))
    tc = SimpleNamespace(checkpoint=SimpleNamespace(monitor="val/loss", mode="min"))
    module = SimpleNamespace(final_metrics={"val/loss": final})
    assert _test_checkpoint(best, module, tc, last) == last
    module.final_metrics["val/loss"] = final + 1e-3  # worse than the best: the best checkpoint is tested
    assert _test_checkpoint(best, module, tc, last) == best_path


def test_bench_overhead_times_a_real_run_against_its_plain_loop(tmp_path, data_cache):
    from mhalab.cli import run_command

    recipe = ["setup=mqar_cpu", "model.n_layers=1", "model.d_model=32", "attention.n_heads=2", "data.mqar.n_train=256",
              "data.mqar.n_val=32", "data.mqar.n_test=32", "stats.plots=false"]
    out = tmp_path / "bench"
    assert run_command(["bench", "overhead", f"recipe=[{','.join(recipe)}]", "rounds=2", "steps_per_round=3",
                        "warmup_steps=2", f"cache_dir={data_cache}", f"out_dir={out}"]) == 0
    result = json.loads((out / "results.json").read_text())
    assert [r["round"] for r in result["rows"]] == [1, 2] and result["flops_per_step"] > 0
    for r in result["rows"]:
        assert r["run_ms"] > 0 and r["plain_ms"] > 0 and r["ratio"] == pytest.approx(r["run_ms"] / r["plain_ms"])
        assert 0 < r["run_peak"] < 1 and 0 < r["plain_peak"] < 1 and r["peak_gflops"] > 0
        assert r["cpu_ratio"] > 0  # process CPU time per step, both sides
    report = (out / "report.md").read_text()
    assert "median run / plain" in report and "plain loop" in report
    assert f"in process CPU time (what other work on a loaded machine moves least): {result['cpu_ratio']:.3f}" in report
    # Lightning's floor: the same plain rounds under a bare Trainer fed the plain loop's batches (8 here, fewer than
    # a round's pool: both cycle through what there is)
    floor = result["floor_rows"]
    assert [r["round"] for r in floor] == [1, 2] and all(r["run_ms"] > 0 and r["plain_ms"] > 0 for r in floor)
    assert result["floor_ratio"] == pytest.approx(statistics.median(r["ratio"] for r in floor))
    assert f"bare Lightning / plain **{result['floor_ratio']:.3f}**" in report
    assert f"run / bare {result['ratio'] / result['floor_ratio']:.3f}" in report
    # and a hand loop under Lightning Fabric on the same batches
    fabric = result["fabric_rows"]
    assert [r["round"] for r in fabric] == [1, 2] and all(r["run_ms"] > 0 and r["plain_ms"] > 0 for r in fabric)
    assert f"Fabric / plain **{result['fabric_ratio']:.3f}**" in report
    # and the bench's null: a second plain loop against the first
    assert len(result["null_rows"]) == 2 and f"plain / plain **{result['null_ratio']:.3f}**" in report


def test_bench_overhead_settings_are_checked():
    from mhalab.bench.config import OverheadConfig
    from mhalab.errors import ConfigError
    from mhalab.options import parse

    assert parse(OverheadConfig, ["rounds=3"]).rounds == 3
    with pytest.raises(ConfigError, match="steps_per_round"):
        parse(OverheadConfig, ["steps_per_round=0"])


def test_stacked_columns_are_typed_as_the_torch_format_types_them(data_cache):
    cfg = DataConfig.from_any({**MQAR, "cache_dir": str(data_cache)})
    split = load_splits(preprocessing.prepare(cfg) / "dataset")["validation"]
    stacked = split.stacked()
    assert {k: v.dtype for k, v in stacked.items()} == {k: v.dtype for k, v in split[0].items()}
    assert all(torch.equal(stacked[k][3], v) for k, v in split[3].items())


@pytest.mark.proc
@pytest.mark.slow  # a real sweep timed in rounds: minutes on a slow 2-core machine
def test_the_sweep_figure_times_a_real_sweep_against_one_plain_process(tmp_path):
    import os

    from mhalab.bench.config import StartupConfig
    from mhalab.bench.sweep import time_sweep
    from mhalab.options import parse

    cfg = parse(StartupConfig, ["sweep_runs=2", "sweep_steps=3", "sweep_rounds=1", "threads=1"])
    env = {**os.environ, "WANDB_SILENT": "true"}
    got = time_sweep(cfg, env, str(tmp_path))
    assert got["runs"] == 2 and got["steps"] == 3 and len(got["rows"]) == 1
    row = got["rows"][0]
    assert row["sweep_s"] > 0 and row["plain_s"] > 0 and got["ratio"] == pytest.approx(row["sweep_s"] / row["plain_s"])
    assert row["sweep_cpu_s"] > 0 and got["cpu_ratio"] == pytest.approx(row["sweep_cpu_s"] / row["plain_cpu_s"])
    jobs = sorted((tmp_path / "sweep0").rglob("summary.json"))
    assert len(jobs) == 2 and all(json.loads(p.read_text())["status"] == "ok" for p in jobs)
