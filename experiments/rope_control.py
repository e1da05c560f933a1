"""RoPE control of a sweep: each arm with every feature rotated minus the same arm with 8 rotated features, paired
by seed (mhalab.stats). Reads the per-seed columns of the two sweeps' `mhalab report` CSVs:

    python experiments/rope_control.py experiments/head_sweep/results/report.csv \
        experiments/head_sweep/results_full_rotary/report.csv
"""

import csv
import sys

from mhalab.stats import paired


def per_seed(path: str) -> dict[str, dict[str, float]]:
    """{arm (the report's config label): {seed: value}} from a report CSV."""
    with open(path, newline="") as f:
        return {row["config"]: {k[5:]: float(v) for k, v in row.items() if k.startswith("seed_") and v}
                for row in csv.DictReader(f)}


def main(controlled: str, full: str) -> None:
    a, b = per_seed(controlled), per_seed(full)
    print("| arm | rotary_dim 8: mean | all features: mean | all − 8 [95% CI] | p | MDE (80%) | verdict |")
    print("|---|---|---|---|---|---|---|")
    for arm in a:
        seeds = sorted(set(a[arm]) & set(b.get(arm, {})), key=int)
        if len(seeds) < 2:
            continue
        d = paired([b[arm][s] - a[arm][s] for s in seeds])
        mean = lambda x: sum(x[s] for s in seeds) / len(seeds)  # noqa: E731
        print(f"| {arm} | {mean(a[arm]):.3f} | {mean(b[arm]):.3f} | {d.mean:+.3f} [{d.ci95_low:+.3f}, "
              f"{d.ci95_high:+.3f}] | {d.p:.2g} | {d.mde80:.3f} | {d.verdict} |")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])
