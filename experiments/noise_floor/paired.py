"""The first sweeps (byte-level masked LM on BBC News, 600 steps, 3 seeds; commit 434c6b8) as paired comparisons.

The per-seed val/bpb below are the values those runs recorded (experiments/*/README.md at commit 434c6b8; rerun with
`git checkout 434c6b8 && python -m mhalab.train -m experiment=<sweep>`). This prints each arm minus its baseline,
paired by seed, with the 95% CI, p, the minimum detectable effect at 80% power and the seeds a 0.1 bpb effect would
need, all from mhalab.report.comparison:  python experiments/noise_floor/paired.py
"""

import statistics

from mhalab.report.comparison import paired, seeds_for

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

if __name__ == "__main__":
    print("| sweep | arm - baseline | mean Δ bpb | 95% CI | p | MDE (80%) | verdict | seeds for 0.1 bpb |")
    print("|---|---|---|---|---|---|---|---|")
    for sweep, (base, arms) in SWEEPS.items():
        for arm, values in arms.items():
            if arm == base:
                continue
            d = [a - b for a, b in zip(values, arms[base])]
            p = paired(d)
            need = seeds_for(0.1, statistics.stdev(d))
            print(f"| {sweep} | {arm} - {base} | {p.mean:+.3f} | [{p.ci95_low:+.3f}, {p.ci95_high:+.3f}] | "
                  f"{p.p:.2f} | {p.mde80:.2f} | {p.verdict} | {need if need else '> 1000'} |")
