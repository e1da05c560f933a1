"""The run contract: summary.json written atomically and read back checked (size, depth, every field's type,
paths inside the run); checkpoints read safely, their architecture checked against their weights before any
model is built."""

import json
import os

import pytest
import torch

from mhalab.training.checkpoint import load_checkpoint, load_module
from mhalab.errors import ConfigError
from mhalab.runs.summary import (MAX_BYTES, SCHEMA_VERSION, RunSummary, from_dict, head_matrix, read_summary,
                                 write_summary)


def nested(depth: int) -> dict:
    out: dict = {"leaf": 1}
    for _ in range(depth):
        out = {"x": out}
    return out


def test_round_trip_keeps_every_field_and_turns_nan_into_null(tmp_path):
    s = RunSummary(status="ok", task="mqar", metrics={"val/acc": float("nan"), "val/loss": 1.5},
                   head_stats={"entropy": [[1.0, 2.0], [3.0, 4.0]]}, head_importance=[[0.6, 0.8]],
                   checkpoints={"best": "checkpoints/best.ckpt", "last": "checkpoints/last.ckpt"})
    write_summary(tmp_path, s)
    back = read_summary(tmp_path)
    assert back.schema_version == SCHEMA_VERSION and back.metrics == {"val/acc": None, "val/loss": 1.5}
    assert torch.equal(head_matrix(back.head_stats["entropy"]), torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    assert back.path(tmp_path, back.checkpoints["last"]) == tmp_path / "checkpoints" / "last.ckpt"
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("data,message", [
    ({"status": "ok", "schema_version": 0}, "schema_version=0"),
    ({"status": "done", "schema_version": SCHEMA_VERSION}, "status='done'"),
    ({"status": "ok", "schema_version": SCHEMA_VERSION, "extra": 1}, "unknown field 'extra'"),
    ({"status": "ok", "schema_version": SCHEMA_VERSION, "metrics": {"val/acc": "high"}}, "field 'metrics'"),
    ({"status": "ok", "schema_version": SCHEMA_VERSION, "head_stats": {"e": [[1.0], [1.0, 2.0]]}}, "'head_stats'"),
    ({"status": "ok", "schema_version": SCHEMA_VERSION, "head_stats": {"e": [[0.0] * 300] * 300}}, "'head_stats'"),
    ({"status": "ok", "schema_version": SCHEMA_VERSION, "plots": ["/etc/passwd"]}, "'plots'"),
    ({"status": "ok", "schema_version": SCHEMA_VERSION, "checkpoints": {"best": "../../x.ckpt"}}, "'checkpoints'"),
    ({"status": "ok", "schema_version": SCHEMA_VERSION, "overrides": ["a=1"] * 20000}, "'overrides'"),
    ({"status": "ok", "schema_version": SCHEMA_VERSION, "config": nested(14)}, "nests deeper"),
    ([1, 2], "JSON object"),
])
def test_summaries_that_are_not_run_summaries_are_refused_naming_the_field(data, message):
    with pytest.raises(ConfigError, match=message):
        from_dict(data, "summary.json")


def test_hostile_files_are_refused_without_reading_them_whole(tmp_path):
    (tmp_path / "big").mkdir()
    with open(tmp_path / "big" / "summary.json", "wb") as f:
        f.truncate(MAX_BYTES + 1)  # sparse: costs no disk
    with pytest.raises(ConfigError, match="more than a summary can be"):
        read_summary(tmp_path / "big")
    (tmp_path / "dev").mkdir()
    os.symlink("/dev/zero", tmp_path / "dev" / "summary.json")
    with pytest.raises(ConfigError, match="not a regular file"):
        read_summary(tmp_path / "dev")
    (tmp_path / "deep").mkdir()
    (tmp_path / "deep" / "summary.json").write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(ConfigError, match="summary.json"):
        read_summary(tmp_path / "deep")


def test_a_copied_run_directory_is_self_contained(tiny_runs, tmp_path):
    import shutil

    from mhalab.analysis.plots import attention_maps_from_checkpoint

    copy = tmp_path / "copy"
    shutil.copytree(tiny_runs[0], copy)
    s = read_summary(copy)
    assert s.path(copy, s.checkpoints["best"]).is_file()
    original = tiny_runs[0] / s.checkpoints["best"]
    os.rename(original, original.with_suffix(".moved"))  # the copy must not read the original run's files
    try:
        assert attention_maps_from_checkpoint(copy, tmp_path / "maps").is_file()
    finally:
        os.rename(original.with_suffix(".moved"), original)


def test_checkpoint_architecture_is_checked_against_its_weights_before_building(tiny_runs, tmp_path):
    ckpt = torch.load(tiny_runs[0] / "checkpoints" / "last.ckpt", weights_only=True)
    assert load_module(tiny_runs[0] / "checkpoints" / "last.ckpt").arch.attention.n_heads == 4
    forged = dict(ckpt, hyper_parameters={**ckpt["hyper_parameters"],
                                          "arch": {**ckpt["hyper_parameters"]["arch"], "vocab_size": 200_000_000}})
    torch.save(forged, tmp_path / "forged.ckpt")
    with pytest.raises(ConfigError, match="vocab_size"):  # refused by the schema's bound, nothing allocated
        load_checkpoint(tmp_path / "forged.ckpt")
    grown = dict(ckpt, hyper_parameters={**ckpt["hyper_parameters"],
                                         "arch": {**ckpt["hyper_parameters"]["arch"], "vocab_size": 1_000_000}})
    torch.save(grown, tmp_path / "grown.ckpt")
    with pytest.raises(ConfigError, match="parameters but its architecture implies"):
        load_checkpoint(tmp_path / "grown.ckpt")


def test_pickled_code_in_a_checkpoint_never_runs(tmp_path):
    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    import pickle

    (tmp_path / "evil.ckpt").write_bytes(pickle.dumps({"state_dict": Payload(), "hyper_parameters": {}}))
    with pytest.raises(ConfigError, match="cannot be loaded safely"):
        load_checkpoint(tmp_path / "evil.ckpt")
    assert not (tmp_path / "pwned").exists()


def test_summary_json_is_plain_json(tmp_path):
    write_summary(tmp_path, RunSummary(status="failed", error={"kind": "nan", "message": "loss is nan at step 6"}))
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["status"] == "failed" and data["schema_version"] == SCHEMA_VERSION
