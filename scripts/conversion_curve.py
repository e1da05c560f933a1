"""The uptraining curve of a conversion design (issue 27; Ainslie et al. 2023, Fig. 5): per target (n_kv_heads), the
metric of each converted init after uptraining against the uptraining fraction, beside the MHA control trained on for
the same extra steps (with the declared margin around it), the source, and GQA from scratch for the same steps.

    python scripts/conversion_curve.py experiments/conversion_margin/results [--out DIR]

Reads every `*/conversion.json` under the folder (one per target and budget, as `mhalab convert` writes them);
writes conversion_curve.csv (target, fraction, arm, init, stage, n, mean and 95% interval over sources) and
conversion_curve.png into --out (default: the folder).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mhalab.pictures import new_figure
from mhalab.stats import lower_is_better
from mhalab.tables import write_csv

COLUMNS = ["n_kv_heads", "fraction", "arm", "init", "stage", "n", "mean", "ci95_low", "ci95_high"]
LINES = {  # (arm prefix, init, stage) -> label of the line
    ("converted", "mean", "after uptraining"): "mean-pool, uptrained",
    ("converted", "first", "after uptraining"): "first head, uptrained",
    ("converted", "random", "after uptraining"): "random KV, uptrained",
    ("source", "-", "same total steps"): "MHA control (same extra steps)",
    ("GQA", "random", "uptraining steps only"): "from scratch, uptraining steps",
}


def points(folder: Path) -> tuple[list[dict], str, float | None]:
    """(one row per target, fraction and arm; the metric; the declared margin) from every conversion.json."""
    files = sorted(folder.glob("*/conversion.json"))
    if not files:
        sys.exit(f"{folder}: no */conversion.json (run `mhalab convert ... --out {folder}/<name>` first)")
    rows, keys, margins = [], set(), set()
    for f in files:
        data = json.loads(f.read_text())
        keys.add(data["key"])
        margins.add(data.get("margin"))
        for t in data["table"]:
            rows.append({"n_kv_heads": data["n_kv_heads"], "fraction": data["uptrain_fraction"], "arm": t["arm"],
                         "init": t["init"], "stage": t["stage"], "n": t["n"], "mean": t[data["key"]],
                         "ci95_low": t["ci95_low"], "ci95_high": t["ci95_high"]})
    if len(keys) != 1 or len(margins) != 1:
        sys.exit(f"{folder}: the conversions report different metrics {sorted(keys)} or margins {sorted(margins)}")
    return sorted(rows, key=lambda r: (r["n_kv_heads"], r["fraction"], r["arm"], r["init"])), keys.pop(), margins.pop()


def line(rows: list[dict], g: int, arm: str, init: str, stage: str) -> list[dict]:
    return [r for r in rows if r["n_kv_heads"] == g and r["arm"].startswith(arm) and r["init"] == init
            and r["stage"] == stage]


def plot(rows: list[dict], key: str, margin: float | None, path: Path) -> None:
    """One panel per target; the axis spans the source, the MHA control (with its margin) and mean-pool, so that the
    margin is readable; a line outside that span is named in the legend with its values instead."""
    targets = sorted({r["n_kv_heads"] for r in rows})
    fig = new_figure(figsize=(5.2 * len(targets), 5.6))
    for i, g in enumerate(targets):
        ax = fig.add_subplot(1, len(targets), i + 1)
        focus = [v for arm, init, stage in (("source", "-", "same total steps"), ("converted", "mean",
                                                                                  "after uptraining"),
                                            ("source", "-", "trained"))
                 for p in line(rows, g, arm, init, stage) for v in (p["ci95_low"], p["ci95_high"])]
        pad = max(margin or 0.0, 0.1 * (max(focus) - min(focus)) if focus else 0.0)
        lo, hi = (min(focus) - pad, max(focus) + pad) if focus else (None, None)
        for (arm, init, stage), label in LINES.items():
            pts = line(rows, g, arm, init, stage)
            if not pts:
                continue
            x = [100 * p["fraction"] for p in pts]
            y = [p["mean"] for p in pts]
            if lo is not None and (min(y) > hi or max(y) < lo):
                ax.plot([], [], " ", label=f"{label}: off the axis ({', '.join(f'{v:.3f}' for v in y)})")
                continue
            err = [[p["mean"] - p["ci95_low"] for p in pts], [p["ci95_high"] - p["mean"] for p in pts]]
            ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=label)
            if arm == "source" and margin is not None:
                ax.fill_between(x, [v - margin for v in y], [v + margin for v in y], alpha=0.15,
                                label=f"control ± the declared margin {margin:g}")
        src = line(rows, g, "source", "-", "trained")
        if src:
            ax.axhline(src[0]["mean"], color="grey", linestyle="--", linewidth=1, label="MHA source as trained")
        if lo is not None:
            ax.set_ylim(lo, hi)
        ax.set_xlabel("uptraining, % of the source's steps")
        ax.set_ylabel(key + (" (lower is better)" if lower_is_better(key) else " (higher is better)"))
        ax.set_title(f"MHA -> {'MQA' if g == 1 else f'GQA-{g}'} (mean, 95% interval over sources)", fontsize=9)
        # below, one column: it hides no point, and no panel's legend runs over its neighbour's
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")  # the legend below the axes, whole


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    out = args.out or args.folder
    out.mkdir(parents=True, exist_ok=True)
    rows, key, margin = points(args.folder)
    write_csv(out / "conversion_curve.csv", COLUMNS, rows)
    plot(rows, key, margin, out / "conversion_curve.png")
    print(f"wrote {out / 'conversion_curve.csv'} and conversion_curve.png ({len(rows)} points, metric {key})")


if __name__ == "__main__":
    main(sys.argv[1:])
