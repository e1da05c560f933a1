"""Statistics on real models: independent of the training backend; importance of a dead head is 0."""

import torch

from mhalab.callbacks import HeadStatsCallback
from mhalab.module import AttentionLitModule
from mhalab.stats import STAT_NAMES, head_importance

CFG = dict(vocab_size=40, max_len=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, dropout=0.0)
OPTIM = dict(lr=3e-3, weight_decay=0.0, warmup_steps=0, min_lr_ratio=1.0)


def batch(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 40, (8, 12), generator=g)
    pad = torch.arange(12).view(1, 12) >= torch.randint(6, 13, (8, 1), generator=g)
    return {"input_ids": ids, "padding_mask": pad, "labels": ids[:, 0] % 3}


def trained(backend: str) -> AttentionLitModule:
    torch.manual_seed(0)
    module = AttentionLitModule({**CFG, "backend": backend}, "classification", 3, OPTIM)
    opt = torch.optim.AdamW(module.parameters(), lr=3e-3)
    for step in range(20):
        loss = module.loss_and_logits(batch(step))[0]
        opt.zero_grad()
        loss.backward()
        opt.step()
    return module


def test_statistics_do_not_depend_on_the_backend_that_trained_the_model():
    probe = batch(100)
    tables = {b: HeadStatsCallback(probe).measure(trained(b))[0] for b in ("sdpa", "math")}
    assert sorted(tables["sdpa"]) == [f"L{l}H{h}" for l in range(2) for h in range(4)]
    for head, row in tables["sdpa"].items():
        for stat in STAT_NAMES:
            assert abs(row[stat] - tables["math"][head][stat]) < 1e-4, (head, stat)


def test_importance_of_a_head_with_no_output_path_is_zero():
    module = trained("sdpa").eval()
    module.zero_grad(set_to_none=True)
    attn = module.attention_layers()[1]
    with torch.no_grad():
        attn.out_proj.weight[:, 2 * attn.d_head:3 * attn.d_head] = 0  # L1H2 writes nothing
    imp = head_importance(module, [batch(200), batch(201)], lambda m, b: m.loss_and_logits(b)[0], normalize=False)
    assert imp.shape == (2, 4) and imp[1, 2] == 0
    assert (imp[0] > 0).all() and (imp[1, [0, 1, 3]] > 0).all()
    assert not attn.head_gate.requires_grad and all(p.grad is None for p in module.parameters())


def test_gated_off_head_changes_nothing_downstream():
    module = trained("sdpa").eval()
    probe = batch(300)
    attn = module.attention_layers()[0]
    base = module(probe).logits
    attn.head_gate[1] = 0
    removed = module(probe).logits
    with torch.no_grad():
        attn.head_gate[1] = 1
        attn.out_proj.weight[:, attn.d_head:2 * attn.d_head] = 0
    assert torch.allclose(removed, module(probe).logits, atol=1e-6) and not torch.allclose(base, removed)
