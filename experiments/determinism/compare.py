"""Compare two finished runs of the same config: every metric, every head statistic, every weight of last.ckpt.

    python experiments/determinism/compare.py RUN_DIR_A RUN_DIR_B

Prints one row per metric (A, B, B - A), then the number of head statistics and weight tensors that differ and
the largest absolute difference of each. "bit-identical" means every value is equal, not merely close; a run that
keeps no last.ckpt (a design's saved runs) is compared on its metrics and head statistics only, and says so.
"""

import sys
from pathlib import Path

import torch

from mhalab.runs.summary import read_summary
from mhalab.tables import Table
from mhalab.training.checkpoint import load_checkpoint


def summary_differences(a, b) -> tuple[list[str], list[float], int]:
    """The metrics whose values differ between two run summaries, the |B - A| of each head statistic that differs,
    and how many head statistics there are."""
    ma, mb = {**a.metrics, **a.test_metrics}, {**b.metrics, **b.test_metrics}
    stats = [(x, y) for k in a.head_stats for ra, rb in zip(a.head_stats[k], b.head_stats[k]) for x, y in zip(ra, rb)]
    return [m for m in sorted(ma) if ma[m] != mb.get(m)], [abs(x - y) for x, y in stats if x != y], len(stats)


def compare(a_dir: str, b_dir: str) -> bool:
    a, b = read_summary(a_dir), read_summary(b_dir)
    t = Table(["metric", "A", "B", "B - A"])
    for name in sorted({**a.metrics, **a.test_metrics}):
        va = {**a.metrics, **a.test_metrics}[name]
        vb = {**b.metrics, **b.test_metrics}.get(name)
        t.add([name, repr(va), repr(vb), "" if vb is None else f"{vb - va:+.3g}"])
    print(t.markdown())
    metrics, differ, n_stats = summary_differences(a, b)
    print(f"\nhead statistics: {len(differ)} of {n_stats} differ, largest |B - A| {max(differ, default=0):.3g}")
    identical = not metrics and not differ
    kept = [s.path(d, s.checkpoints["last"]) for s, d in ((a, a_dir), (b, b_dir)) if s.checkpoints.get("last")]
    if len(kept) < 2 or not all(Path(k).is_file() for k in kept):  # a saved design run keeps no checkpoint
        print("weights: not compared (a run keeps no last.ckpt)")
        print("bit-identical in metrics and head statistics" if identical else "not identical")
        return identical
    wa, wb = (load_checkpoint(k)["state_dict"] for k in kept)
    diffs = [(wa[k].double() - wb[k].double()).abs().max().item() for k in wa if not torch.equal(wa[k], wb[k])]
    print(f"weights (last.ckpt): {len(diffs)} of {len(wa)} tensors differ, largest |B - A| {max(diffs, default=0):.3g}")
    identical &= not diffs
    print("bit-identical" if identical else "not identical")
    return identical


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    compare(sys.argv[1], sys.argv[2])
