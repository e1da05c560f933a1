"""The GPU options, run on the CPU (this project has no GPU): the `trainer=gpu` recipe in bf16-mixed, statistics and
importance in float32 under autocast, `model.compile`, and fused AdamW (`optim.fused`)."""

import dataclasses
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import refusal, summaries

from mhalab.cost import kv_cache_bytes
from mhalab.training.module import adamw_kwargs
from mhalab.architecture import Architecture, AttentionConfig, ModelConfig
from mhalab.config.schema import OptimConfig, StatsConfig, clips_under_amp
from mhalab.head_statistics import DETECTOR_NAMES, STAT_NAMES


def finite(values) -> bool:
    return all(math.isfinite(v) for row in values for v in (row if isinstance(row, list) else [row]))


@pytest.mark.proc
@pytest.mark.slow
def test_the_gpu_recipe_trains_on_the_cpu_in_bf16_mixed(run_train, tmp_path):
    """The installed `mhalab` console, `trainer=gpu` with only the accelerator changed: statistics, importance,
    checkpoints and the test of the best one, all in a bf16-mixed run."""
    mhalab = str(Path(sys.executable).with_name("mhalab"))
    r = run_train("trainer=gpu", "trainer.accelerator=cpu", "torch_threads=1", command=[mhalab, "train"])
    assert r.returncode == 0, r.stderr[-3000:]
    (s,) = summaries(tmp_path)
    assert s["status"] == "ok" and s["config"]["trainer"]["precision"] == "bf16-mixed"
    assert s["config"]["trainer"]["accelerator"] == "cpu" and s["environment"]["device"] == "cpu"
    assert {"val/loss", "val/acc", "train/loss"} <= set(s["metrics"]) and "test/acc" in s["test_metrics"]
    assert all(math.isfinite(v) for v in [*s["metrics"].values(), *s["test_metrics"].values()])
    assert set(s["head_stats"]) == set(STAT_NAMES + DETECTOR_NAMES)
    assert all(len(v) == 1 and len(v[0]) == 2 and finite(v) for v in s["head_stats"].values())
    assert len(s["head_importance"]) == 1 and finite(s["head_importance"])
    run_dir = next(tmp_path.rglob("summary.json")).parent
    assert (run_dir / s["checkpoints"]["last"]).is_file() and (run_dir / s["checkpoints"]["best"]).is_file()
    # the KV cache holds the keys' dtype (bf16 under the autocast): 2 bytes per element, 2 KV heads of 16
    assert s["cost"]["kv_cache_bytes_per_token"] == kv_cache_bytes(2, 16, 2) == 2 * 2 * 16 * 2


def _module():
    from mhalab.training.module import AttentionLitModule

    arch = Architecture(vocab_size=50, objective="classification", n_classes=3,
                        model=ModelConfig(d_model=32, n_layers=2, d_ff=64, dropout=0.0, max_len=16),
                        attention=AttentionConfig(n_heads=4, n_kv_heads=2))
    torch.manual_seed(0)
    return AttentionLitModule(arch.to_dict(), dataclasses.asdict(OptimConfig()), None)


def _batch(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    pad = torch.arange(16)[None, :] >= torch.tensor([16, 12, 9, 5])[:, None]  # (B, T), True = padding
    return {"input_ids": torch.randint(0, 50, (4, 16), generator=g), "padding_mask": pad,
            "labels": torch.randint(0, 3, (4,), generator=g)}


def test_statistics_and_importance_are_float32_under_a_bf16_autocast():
    """A mixed-precision run's statistics are those of the float32 parameters: the same numbers under an autocast
    as without one (the probe pass and importance turn it off), while the model itself does run in bf16 there."""
    from mhalab.training.callbacks import HeadStatsCallback
    from mhalab.training.evaluation import importance

    module = _module()
    cb = HeadStatsCallback(stats=StatsConfig())
    cb.probe = _batch(0)
    plain, plain_groups, _ = cb.measure(module)
    plain_imp = importance(module, [_batch(1)])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert module.eval()(_batch(0)).logits.dtype == torch.bfloat16  # the autocast is on for the model
        mixed, mixed_groups, weights = cb.measure(module)
        mixed_imp = importance(module, [_batch(1)])
    assert all(w.dtype == torch.float32 for w in weights)
    for key in plain:
        assert torch.equal(mixed[key], plain[key]), key
    for key in plain_groups:
        assert torch.equal(mixed_groups[key].nan_to_num(), plain_groups[key].nan_to_num()), key
    assert torch.equal(mixed_imp, plain_imp)


def test_adamw_is_fused_when_every_parameter_is_on_cuda():
    cuda = SimpleNamespace(device=torch.device("cuda", 0), is_floating_point=lambda: True)  # stands for a CUDA tensor
    cpu = torch.zeros(2)
    assert adamw_kwargs(None, [cuda, cuda]) == {"fused": True}
    assert adamw_kwargs(None, [cpu]) == {} and adamw_kwargs(None, [cuda, cpu]) == {} and adamw_kwargs(None, []) == {}
    assert adamw_kwargs(False, [cuda]) == {"fused": False} and adamw_kwargs(True, [cpu]) == {"fused": True}
    assert adamw_kwargs(None, [cuda, cuda], amp_clips=True) == {}  # Lightning would refuse to clip a fused one


@pytest.mark.parametrize("precision,clip,clips", [("bf16-mixed", 1.0, True), ("16-mixed", 0.5, True),
                                                  ("bf16-mixed", None, False), ("bf16-mixed", 0.0, False),
                                                  ("32-true", 1.0, False), ("bf16-true", 1.0, False)])
def test_clips_under_amp_names_when_lightning_clips_in_its_mixed_precision_plugin(precision, clip, clips):
    assert clips_under_amp(precision, clip) is clips


def _fit(precision: str, fused: bool | None, clip: float | None):
    """A real 2-step Lightning fit on the CPU: torch has a fused AdamW kernel there too (torch >= 2.4)."""
    import lightning as L
    from torch.utils.data import DataLoader

    module = _module()
    module.hparams.optim["fused"] = fused
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=2, precision=precision, gradient_clip_val=clip,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0)
    trainer.fit(module, train_dataloaders=DataLoader([_batch(s) for s in range(2)], batch_size=None))
    return module


def test_a_fused_adamw_clipped_under_mixed_precision_is_what_lightning_refuses():
    """The premise of clips_under_amp, against the real Lightning: the RuntimeError `mhalab train trainer=gpu` hit
    on an H100 (experiments/gpu); without clipping, or in float32, the same fused optimizer trains."""
    with pytest.raises(RuntimeError, match="does not allow for gradient clipping"):
        _fit("bf16-mixed", True, 1.0)
    for precision, clip in (("bf16-mixed", None), ("32-true", 1.0)):
        assert all(torch.isfinite(p).all() for p in _fit(precision, True, clip).parameters())


def test_fused_true_with_clipping_under_mixed_precision_is_one_sentence(train, tmp_path):
    r = train("optim.fused=true", "trainer.precision=bf16-mixed")
    assert ("optim.fused=true with trainer.precision=bf16-mixed and trainer.gradient_clip_val=1.0: Lightning cannot "
            "clip a fused AdamW's gradients under mixed precision") in refusal(r)
    assert not (tmp_path / "logs").exists() or not list((tmp_path / "logs").rglob("summary.json"))


@pytest.mark.parametrize("fused,implementation", [("null", None), ("true", True), ("false", False)])
def test_adamw_trains_on_the_cpu_with_each_fused_setting(train, tmp_path, monkeypatch, fused, implementation):
    """On the CPU auto is torch's default AdamW; true runs torch's fused CPU kernel (torch >= 2.4)."""
    made = []
    real_init = torch.optim.AdamW.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        made.append(self.defaults["fused"])

    monkeypatch.setattr(torch.optim.AdamW, "__init__", init)
    r = train(f"optim.fused={fused}", "stats=off", "trainer.limit_train_batches=2", "test=false")
    assert r.returncode == 0, r.stderr[-3000:]
    (s,) = summaries(tmp_path)
    assert s["status"] == "ok" and s["config"]["optim"]["fused"] is implementation and made == [implementation]
    assert math.isfinite(s["metrics"]["train/loss"])


def test_model_compile_trains_and_keeps_the_checkpoint_keys(train, tmp_path):
    r = train("model.compile=true", "model.compile_backend=aot_eager", "trainer.limit_train_batches=2", "test=false")
    assert r.returncode == 0, r.stderr[-3000:]
    (s,) = summaries(tmp_path)
    assert s["status"] == "ok" and s["config"]["model"]["compile"] is True
    assert s["config"]["model"]["compile_backend"] == "aot_eager"
    assert "compile" not in s["architecture"]["model"]  # how it ran, not what it is
    assert s["head_stats"]["entropy"] and math.isfinite(s["metrics"]["val/loss"])
    run_dir = next(tmp_path.rglob("summary.json")).parent
    state = torch.load(run_dir / s["checkpoints"]["last"], weights_only=True)["state_dict"]
    assert not any("_orig_mod" in k or "compiled" in k for k in state)  # the eager model's keys


def test_compile_runs_the_training_step_through_torch_compile():
    module = _module()
    module.compile_training("eager")
    counted = []
    compiled = module.__dict__["_compiled_forward"]
    module.__dict__["_compiled_forward"] = lambda *a: counted.append(1) or compiled(*a)
    logits, _ = module.logits_and_labels(_batch(0), training=True)
    module.logits_and_labels(_batch(0))  # evaluation: eager
    assert counted == [1] and logits.shape == (4, 3)
    assert set(module.state_dict()) == set(_module().state_dict())


@pytest.mark.parametrize("override,message", [
    ("model.compile_backend=tvm", "model.compile_backend='tvm': compile_backend must be one of inductor, aot_eager"),
    ("optimized_metric=val/f1", "optimized_metric='val/f1': optimized_metric must be one of val/loss, val/acc"),
])
def test_bad_values_are_one_sentence(train, tmp_path, override, message):
    r = train(override)
    assert message in refusal(r), r.stderr
    assert not (tmp_path / "logs").exists() or not list((tmp_path / "logs").rglob("summary.json"))
