"""Compare two finished runs of the same config: every metric, every head statistic, every weight of last.ckpt.

    python experiments/determinism/compare.py RUN_DIR_A RUN_DIR_B

Prints one row per metric (A, B, B - A), then the number of head statistics and weight tensors that differ and
the largest absolute difference of each. "bit-identical" means every value is equal, not merely close.
"""

import sys

import torch

from mhalab.runs.summary import read_summary
from mhalab.tables import Table
from mhalab.training.checkpoint import load_checkpoint


def compare(a_dir: str, b_dir: str) -> bool:
    a, b = read_summary(a_dir), read_summary(b_dir)
    identical = True
    t = Table(["metric", "A", "B", "B - A"])
    for name in sorted({**a.metrics, **a.test_metrics}):
        va = {**a.metrics, **a.test_metrics}[name]
        vb = {**b.metrics, **b.test_metrics}.get(name)
        identical &= va == vb
        t.add([name, repr(va), repr(vb), "" if vb is None else f"{vb - va:+.3g}"])
    print(t.markdown())
    stats = [(k, x, y) for k in a.head_stats for ra, rb in zip(a.head_stats[k], b.head_stats[k])
             for x, y in zip(ra, rb)]
    differ = [abs(x - y) for _, x, y in stats if x != y]
    print(f"\nhead statistics: {len(differ)} of {len(stats)} differ, largest |B - A| {max(differ, default=0):.3g}")
    wa = load_checkpoint(a.path(a_dir, a.checkpoints["last"]))["state_dict"]
    wb = load_checkpoint(b.path(b_dir, b.checkpoints["last"]))["state_dict"]
    diffs = [(wa[k].double() - wb[k].double()).abs().max().item() for k in wa if not torch.equal(wa[k], wb[k])]
    print(f"weights (last.ckpt): {len(diffs)} of {len(wa)} tensors differ, largest |B - A| {max(diffs, default=0):.3g}")
    identical &= not differ and not diffs
    print("bit-identical" if identical else "not identical")
    return identical


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    compare(sys.argv[1], sys.argv[2])
