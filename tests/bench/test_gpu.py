"""GPU checks, `pytest -m gpu` (`mhalab bench gpu` runs them first): skipped where there is no CUDA device.

- sdpa and math attention in bf16 and fp16 against a float32 reference, output and input gradient;
- training attention runs on a fused kernel: torch's own choice for a forward and
  backward must not raise, for MHA, GQA and MQA, with and without padding;
- incremental decoding with the KV cache equals a full forward pass;
- head statistics (the callback's pass) and importance equal those computed on the CPU;
- a checkpoint written by a Lightning fit on the GPU loads on the CPU (`mhalab.training.checkpoint.load_module`).

MHALAB_GPU_TESTS_ON_CPU=1 runs them on the CPU instead, to check the tests themselves (the kernel test then only
allows the CPU's flash kernel); that says nothing about a GPU.
"""

import copy
import dataclasses
import os

import pytest
import torch

from mhalab.attention import MultiHeadAttention
from mhalab.architecture import Architecture, AttentionConfig, ModelConfig
from mhalab.config.schema import OptimConfig, StatsConfig

DEVICE = "cpu" if os.environ.get("MHALAB_GPU_TESTS_ON_CPU") == "1" else "cuda"
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="no CUDA device")]
LAYOUTS = [("MHA", 8), ("GQA", 2), ("MQA", 1)]
# relative Frobenius error ||x - ref|| / ||ref|| against float32 math attention; bf16 keeps 8 mantissa bits, fp16 11
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 4e-3}


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.float() - ref.float()).norm() / ref.float().norm()).item()


def padding(batch: int, seq_len: int) -> torch.Tensor:
    """(B, T) bool, True = padding: row b keeps T - 7 b tokens (row 0 unpadded)."""
    lengths = torch.tensor([max(1, seq_len - 7 * b) for b in range(batch)])
    return (torch.arange(seq_len)[None, :] >= lengths[:, None]).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("layout,kv", LAYOUTS, ids=[name for name, _ in LAYOUTS])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_sdpa_and_math_in_half_precision_match_float32(dtype, layout, kv, padded):
    torch.manual_seed(0)
    ref = MultiHeadAttention(512, 8, kv, 64, backend="math").to(DEVICE)
    x32 = torch.randn(4, 256, 512, device=DEVICE, requires_grad=True)  # (B, T, d_model)
    g32 = torch.randn(4, 256, 512, device=DEVICE)
    pad = padding(4, 256) if padded else None
    y32, _ = ref(x32, key_padding_mask=pad)
    y32.backward(g32)
    for backend in ("sdpa", "math"):
        layer = copy.deepcopy(ref).to(dtype)
        layer.backend = backend
        x = x32.detach().to(dtype).requires_grad_(True)
        y, _ = layer(x, key_padding_mask=pad)
        y.backward(g32.to(dtype))
        assert torch.isfinite(y).all() and torch.isfinite(x.grad).all(), backend
        assert rel_err(y, y32) < TOLERANCE[dtype], (backend, rel_err(y, y32))
        assert rel_err(x.grad, x32.grad) < 2 * TOLERANCE[dtype], (backend, rel_err(x.grad, x32.grad))


@pytest.mark.parametrize("layout,kv", LAYOUTS, ids=[name for name, _ in LAYOUTS])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_training_attention_runs_on_a_fused_kernel(layout, kv, padded):
    """torch's own choice for a training step's attention (forward and backward) is a fused kernel, not its math
    fallback. On an H100 (torch 2.11, experiments/gpu) that is cuDNN's for all six cases; flash and
    memory-efficient alone have no kernel for padded GQA/MQA (flash takes no mask, efficient no grouped K/V)."""
    from mhalab.bench.timing import kernel_name, sdpa_kernels

    torch.manual_seed(0)
    layer = MultiHeadAttention(512, 8, kv, 64, backend="sdpa").to(DEVICE, torch.bfloat16)
    x = torch.randn(4, 256, 512, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)  # (B, T, d_model)
    pad = padding(4, 256) if padded else None

    def step():
        y, _ = layer(x, key_padding_mask=pad)
        y.float().square().mean().backward()

    kernels = sdpa_kernels(step)
    assert not kernel_name(kernels).startswith("math"), kernels
    assert any(k.endswith("backward") for k in kernels), kernels  # the backward is fused too


@pytest.mark.parametrize("layout,kv", LAYOUTS, ids=[name for name, _ in LAYOUTS])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)], ids=["fp32", "bf16"])
def test_kv_cache_decoding_equals_a_full_forward(layout, kv, dtype, tol):
    from mhalab.model import LanguageModel

    arch = Architecture(vocab_size=97, objective="clm",
                        model=ModelConfig(d_model=128, n_layers=2, d_ff=256, dropout=0.0, max_len=64, pos="rotary"),
                        attention=AttentionConfig(n_heads=8, n_kv_heads=kv))
    torch.manual_seed(0)
    model = LanguageModel(arch).to(DEVICE, dtype).eval()
    ids = torch.randint(0, 97, (3, 40), device=DEVICE)  # (B, T)
    with torch.no_grad():
        full = model(ids).logits  # (B, T, V)
        caches = model.encoder.new_caches(3, max_len=40)
        steps = [model(ids[:, :9], caches=caches).logits]
        steps += [model(ids[:, t:t + 1], caches=caches).logits for t in range(9, 40)]
    assert rel_err(torch.cat(steps, dim=1), full) < tol


def _classifier() -> Architecture:
    return Architecture(vocab_size=50, objective="classification", n_classes=3,
                        model=ModelConfig(d_model=64, n_layers=2, d_ff=128, dropout=0.0, max_len=32),
                        attention=AttentionConfig(n_heads=4, n_kv_heads=2))


def _batch(seed: int, batch: int = 8, seq_len: int = 32) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, 50, (batch, seq_len), generator=g),
            "padding_mask": padding(batch, seq_len).cpu(), "labels": torch.randint(0, 3, (batch,), generator=g)}


def test_statistics_and_importance_on_gpu_equal_those_on_cpu():
    from mhalab.training.callbacks import HeadStatsCallback
    from mhalab.training.evaluation import importance
    from mhalab.training.module import AttentionLitModule

    torch.manual_seed(0)
    cpu = AttentionLitModule(_classifier().to_dict(), dataclasses.asdict(OptimConfig()), None)
    gpu = copy.deepcopy(cpu).to(DEVICE)
    cb = HeadStatsCallback(stats=StatsConfig())
    cb.probe = _batch(0)
    stats_cpu, groups_cpu, _ = cb.measure(cpu)
    stats_gpu, groups_gpu, _ = cb.measure(gpu)
    assert set(stats_gpu) == set(stats_cpu)
    for key in stats_cpu:
        torch.testing.assert_close(stats_gpu[key], stats_cpu[key], atol=1e-4, rtol=1e-4, msg=key)
    for key in groups_cpu:
        torch.testing.assert_close(groups_gpu[key], groups_cpu[key], atol=1e-5, rtol=1e-4, equal_nan=True, msg=key)
    batches = [_batch(1), _batch(2)]
    torch.testing.assert_close(importance(gpu, batches).cpu(), importance(cpu, batches), atol=1e-5, rtol=1e-3)


def test_a_checkpoint_saved_on_gpu_loads_on_cpu(tmp_path):
    import lightning as L
    from torch.utils.data import DataLoader

    from mhalab.training.checkpoint import load_module
    from mhalab.training.module import AttentionLitModule

    path, seen = tmp_path / "gpu.ckpt", []

    class SaveInFit(L.Callback):  # Lightning moves the module back to the CPU when fit ends: save before that
        def on_train_end(self, trainer, pl_module):
            seen.append(next(pl_module.parameters()).device.type)
            trainer.save_checkpoint(path)

    torch.manual_seed(0)
    module = AttentionLitModule(_classifier().to_dict(), dataclasses.asdict(OptimConfig()), None)
    trainer = L.Trainer(accelerator="gpu" if DEVICE == "cuda" else "cpu", devices=1, max_steps=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, callbacks=[SaveInFit()])
    trainer.fit(module, train_dataloaders=DataLoader([_batch(s) for s in range(4)], batch_size=None))
    assert seen == [DEVICE]
    raw = torch.load(path, weights_only=True)["state_dict"]  # as saved: on the GPU it was trained on
    assert {v.device.type for v in raw.values()} == {DEVICE}
    loaded = load_module(path)
    assert next(loaded.parameters()).device.type == "cpu"
    state = loaded.state_dict()
    for key, value in module.state_dict().items():
        torch.testing.assert_close(state[key], value.cpu(), msg=key)
    batch = _batch(9)
    with torch.no_grad():
        on_gpu = module.eval()(module.to_device(batch)).logits.cpu()
        on_cpu = loaded(batch).logits
    torch.testing.assert_close(on_cpu, on_gpu, atol=1e-4, rtol=1e-4)
