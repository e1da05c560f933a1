"""Reference values from the code before hooks (commit a08120a): every statistic, importance, zero/mean ablation
and pruning of two tiny trained models, saved with their weights and batches, for tests/heads/test_hooks.py.
Run with that commit's code: git checkout a08120a -- src && PYTHONPATH=src python tests/heads/make_hooks_reference.py
"""
import dataclasses
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from conftest import arch
from mhalab.training.module import AttentionLitModule
from mhalab.config.schema import OptimConfig
from mhalab.training.evaluation import mean_loss, importance
from mhalab.training.callbacks import HeadStatsCallback
from mhalab.analysis.ablate import single_head_ablation, pruning_curve, MeanAblation

OPTIM = dataclasses.asdict(OptimConfig(lr=3e-3, weight_decay=0.0, warmup_steps=0, min_lr_ratio=1.0))
CASES = {
    "cls": dict(objective="classification", sizes=dict(max_len=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                                        d_ff=64, dropout=0.0)),
    "clm": dict(objective="clm", sizes=dict(max_len=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
                                             dropout=0.0, pos="rotary")),
}

def batch(seed, objective):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 40, (8, 12), generator=g)
    pad = torch.arange(12).view(1, 12) >= torch.randint(6, 13, (8, 1), generator=g)
    if objective == "classification":
        labels = ids[:, 0] % 3
    else:
        labels = torch.where(pad, -100, torch.roll(ids, -1, 1)); labels[:, -1] = -100
    return {"input_ids": ids, "padding_mask": pad, "labels": labels}

out = {}
for name, c in CASES.items():
    torch.manual_seed(0)
    a = arch(40, c["objective"], 3 if c["objective"] == "classification" else None, **c["sizes"])
    m = AttentionLitModule(a.to_dict(), OPTIM, [1] * 40 if c["objective"] != "classification" else None)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    for step in range(30):
        loss = mean_loss(m, batch(step, c["objective"]))
        opt.zero_grad(); loss.backward(); opt.step()
    m.eval()
    probe = batch(100, c["objective"])
    batches = [batch(200 + i, c["objective"]) for i in range(3)]
    cb = HeadStatsCallback(); cb.probe = probe
    stats, groups, _ = cb.measure(m)
    imp_raw = importance(m, batches, normalize=False)
    imp = importance(m, batches)
    base, rows = single_head_ablation(m, batches)
    means = MeanAblation(m).fit(batches).means
    curve = pruning_curve(m, batches, step=0.25)
    out[name] = {"objective": c["objective"], "arch": a.to_dict(),
                 "state_dict": {k: v.clone() for k, v in m.state_dict().items()},
                 "probe": probe, "batches": batches, "stats": stats, "groups": groups, "importance_raw": imp_raw,
                 "importance": imp, "base": base, "rows": rows, "means": means, "curve": curve}
torch.save(out, HERE / "hooks_reference.pt")
print({k: v["base"] for k, v in out.items()}, [r["pruned_now"] for r in out["cls"]["curve"]])
