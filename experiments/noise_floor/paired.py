"""The first sweeps (byte-level masked LM on BBC News, 600 steps, 3 seeds; commit 434c6b8) with the report's tests.

The per-seed val/bpb below are the values those runs recorded (experiments/*/README.md at commit 434c6b8; rerun with
`git checkout 434c6b8 && python -m mhalab.train -m experiment=<sweep>`). Each arm's parameter shapes differ from its
baseline's, so a seed gives them different initialisations and the runs are independent: this prints each arm minus
its baseline with the exact permutation test (as `mhalab report` does), its inverted 95% interval, p, Holm's p over
all the comparisons, the smallest p 3 vs 3 runs can give and the verdict, all from mhalab.stats, as a table in
paired.md (which the README copies):
    python experiments/noise_floor/paired.py [OUT]    # OUT: default paired.md beside this script
"""

import sys
from pathlib import Path

from mhalab.stats import ALPHA, holm, two_sample
from mhalab.tables import Table, fmt_p, interval

SWEEPS = {  # sweep -> (baseline arm, {arm: [seed 0, 1, 2]})
    "head_sweep (n_heads at d_model 64)": ("n_heads=2", {
        "n_heads=1": [3.259, 3.480, 4.210], "n_heads=2": [3.112, 3.259, 3.727], "n_heads=4": [3.270, 3.351, 3.747],
        "n_heads=8": [3.683, 3.324, 4.307], "n_heads=16": [4.217, 4.183, 4.276]}),
    "kv_sweep (8 heads, 600 steps)": ("n_kv_heads=8", {
        "n_kv_heads=8": [3.683, 3.324, 4.307], "n_kv_heads=4": [3.670, 3.247, 3.707],
        "n_kv_heads=2": [3.798, 3.552, 3.267], "n_kv_heads=1": [3.562, 3.198, 3.705]}),
    "kv_sweep (8 heads, 1500 steps)": ("n_kv_heads=8", {
        "n_kv_heads=8": [2.928, 2.812, 3.377], "n_kv_heads=1": [2.759, 2.642, 2.842]}),
    "head_dim_sweep (16 heads)": ("d_head=4", {
        "d_head=4": [4.217, 4.183, 4.276], "d_head=8": [3.525, 3.286, 3.594], "d_head=16": [3.842, 3.449, 3.381],
        "d_head=32": [3.626, 3.118, 3.229]}),
}


def table() -> Table:
    comparisons = [(sweep, arm, base, two_sample(values, arms[base]))
                   for sweep, (base, arms) in SWEEPS.items() for arm, values in arms.items() if arm != base]
    t = Table(["sweep", "arm - baseline", "mean Δ bpb [95% CI]", "p", "Holm p", "verdict"])
    for (sweep, arm, base, c), p_holm in zip(comparisons, holm([c.p for *_, c in comparisons])):
        verdict = ("separated" if p_holm < ALPHA else
                   f"not separable: the smallest p of 3 vs 3 runs is {c.p_min:.2g}" if c.p_min >= ALPHA else
                   "not separated")
        t.add([sweep, f"{arm} - {base}", interval(c.mean, c.ci95_low, c.ci95_high, unbounded=True),
               fmt_p(c.p), fmt_p(p_holm), verdict])
    return t


if __name__ == "__main__":
    text = table().markdown() + "\n"
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "paired.md"
    out.write_text(text)
    print(text, end="")
