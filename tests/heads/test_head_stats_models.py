"""Statistics on real models: independent of the training backend; importance of a dead head is 0; importance is
the mean of per-example gradients, whatever the batching."""

import torch

import dataclasses

from conftest import arch

from mhalab.analysis.ablate import zero_heads
from mhalab.training.callbacks import HeadStatsCallback
from mhalab.training.evaluation import mean_loss
from mhalab.hooks import act_name, hooks
from mhalab.training.module import AttentionLitModule
from mhalab.config.schema import OptimConfig
from mhalab.head_statistics import DETECTOR_NAMES, STAT_NAMES, head_importance

CFG = dict(max_len=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, dropout=0.0)
OPTIM = dataclasses.asdict(OptimConfig(lr=3e-3, weight_decay=0.0, warmup_steps=0, min_lr_ratio=1.0))


def lit(objective: str = "classification", **sizes) -> AttentionLitModule:
    a = arch(40, objective, 3 if objective == "classification" else None, **{**CFG, **sizes})
    return AttentionLitModule(a.to_dict(), OPTIM, [1] * 40 if objective != "classification" else None)


def batch(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 40, (8, 12), generator=g)
    pad = torch.arange(12).view(1, 12) >= torch.randint(6, 13, (8, 1), generator=g)
    return {"input_ids": ids, "padding_mask": pad, "labels": ids[:, 0] % 3}


def trained(backend: str) -> AttentionLitModule:
    torch.manual_seed(0)
    module = lit(backend=backend)
    opt = torch.optim.AdamW(module.parameters(), lr=3e-3)
    for step in range(20):
        loss = mean_loss(module, batch(step))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return module


def test_statistics_do_not_depend_on_the_backend_that_trained_the_model():
    stats = {}
    for backend in ("sdpa", "math"):
        callback = HeadStatsCallback()
        callback.probe = batch(100)
        stats[backend] = callback.measure(trained(backend))[0]  # {stat: (n_layers, n_heads)}
    assert set(stats["sdpa"]) == set(STAT_NAMES + DETECTOR_NAMES)
    for stat in STAT_NAMES + DETECTOR_NAMES:
        assert stats["sdpa"][stat].shape == (2, 4)
        assert torch.allclose(stats["sdpa"][stat], stats["math"][stat], atol=1e-4), stat


def test_importance_of_a_head_with_no_output_path_is_zero():
    module = trained("sdpa").eval()
    module.zero_grad(set_to_none=True)
    attn = module.attention_layers()[1]
    with torch.no_grad():
        attn.out_proj.weight[:, 2 * attn.d_head:3 * attn.d_head] = 0  # L1H2 writes nothing
    imp = head_importance(module, [batch(200), batch(201)], mean_loss, normalize=False)
    assert imp.shape == (2, 4) and imp[1, 2] == 0
    assert (imp[0] > 0).all() and (imp[1, [0, 1, 3]] > 0).all()
    assert not attn.hook_fns and all(p.grad is None for p in module.parameters())


def test_zeroed_head_changes_nothing_downstream():
    module = trained("sdpa").eval()
    probe = batch(300)
    attn = module.attention_layers()[0]
    base = module(probe).logits
    with zero_heads(module, [(0, 1)]):
        removed = module(probe).logits
    with torch.no_grad():
        attn.out_proj.weight[:, attn.d_head:2 * attn.d_head] = 0
    assert torch.allclose(removed, module(probe).logits, atol=1e-6) and not torch.allclose(base, removed)


# ---------------------------------------------------------------- importance is a mean over examples


def importance_case(objective: str) -> tuple[AttentionLitModule, dict]:
    """A tiny model and 16 padded examples; for the LM objectives examples predict different numbers of tokens,
    and example 5 predicts none."""
    torch.manual_seed(1)
    if objective == "classification":
        module = lit(objective)
    else:
        module = lit(objective, n_kv_heads=4, pos="rotary" if objective == "clm" else "learned")
    with torch.no_grad():  # larger weights than the N(0, 0.02) init, so heads differ and gradients are not tiny
        for p in module.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(5, 40, (16, 12), generator=g)
    pad = torch.arange(12).view(1, 12) >= torch.randint(4, 13, (16, 1), generator=g)
    if objective == "classification":
        labels = ids[:, 1] % 3
    else:
        target = torch.roll(ids, -1, 1) if objective == "clm" else ids
        labels = torch.where(pad | (torch.rand(16, 12, generator=g) < 0.4), -100, target)
        labels[5] = -100
    return module.eval(), {"input_ids": ids, "padding_mask": pad, "labels": labels}


def brute_force_importance(module, examples: dict, removed=()) -> torch.Tensor:
    """Per example: autograd.grad of that example's own loss w.r.t. gates multiplying each head's output at hook_z
    (1, or 0 for the `removed` (layer, head) pairs), abs, averaged over examples."""
    layers = module.attention_layers()
    gates = [torch.tensor([0.0 if (l, h) in removed else 1.0 for h in range(layer.n_heads)], requires_grad=True)
             for l, layer in enumerate(layers)]

    def gate(l):
        def fn(z, hook):  # (B, T, H, D)
            return z * gates[l].view(1, 1, -1, 1)
        return fn

    total, n = torch.zeros(len(gates), gates[0].numel()), 0
    with hooks(module, [(act_name("z", l), gate(l)) for l in range(len(layers))]):
        for i in range(examples["input_ids"].shape[0]):
            ex = {k: v[i:i + 1] for k, v in examples.items()}
            if (ex["labels"] != -100).any():
                total += torch.stack(torch.autograd.grad(mean_loss(module, ex), gates)).abs()
                n += 1
    return total / n


def split(examples: dict, size: int) -> list[dict]:
    n = examples["input_ids"].shape[0]
    return [{k: v[i:i + size] for k, v in examples.items()} for i in range(0, n, size)]


def test_importance_matches_per_example_gradients_and_ignores_batching():
    loss_fn = mean_loss
    for objective in ("classification", "mlm", "clm"):
        module, examples = importance_case(objective)
        ref = brute_force_importance(module, examples)
        assert (ref > 0).all()
        for size in (1, 4, 16):
            imp = head_importance(module, split(examples, size), loss_fn, normalize=False)
            assert torch.allclose(imp, ref, rtol=1e-4, atol=1e-7), (objective, size, imp, ref)
            normed = head_importance(module, split(examples, size), loss_fn)
            assert torch.allclose(normed, ref / ref.norm(dim=-1, keepdim=True), rtol=1e-4, atol=1e-6)
        assert all(p.grad is None for p in module.parameters())
        assert not any(layer.hook_fns for layer in module.attention_layers())


def test_importance_with_a_gated_off_head():
    """A pruned head (zeroed at hook_z) gets 0; the others get their per-example gradients with it removed."""
    module, examples = importance_case("classification")
    ref = brute_force_importance(module, examples, removed={(0, 2)})
    with zero_heads(module, [(0, 2)]):
        imp = head_importance(module, split(examples, 4), mean_loss, normalize=False)
    assert imp[0, 2] == 0 and ref[0, 2] > 0  # the derivative at gate 0 is not 0, but the head is gone
    ref[0, 2] = 0
    assert torch.allclose(imp, ref, rtol=1e-4, atol=1e-7)
