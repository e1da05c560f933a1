"""The options of `mhalab report` (its command line: `mhalab.options`), kept apart from the command
(`report.command`, which imports numpy) so that `mhalab report --help` answers at once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from mhalab.options import option


@dataclass
class ReportOptions:
    """tables, paired confidence intervals and plots of sweeps"""

    dirs: list[Path] = option(positional=True, help="multirun directories (or any folders holding summary.json)")
    out: Optional[Path] = option(None, "output folder (default <first dir>/report)")
    metric: Optional[str] = option(None, "a key of the summaries' metrics (default val/acc for classification, "
                                         "val/bpb for text language modelling)")
    baseline: Optional[str] = option(None, "the arm every other one is compared with, e.g. "
                                           "'attention.n_kv_heads=8' (default: the first arm)")
    same_arm: list[str] = option([], "override keys that do not make an arm of their own: a design's second "
                                       "numerics, e.g. --same-arm trainer.precision (scripts/run_design.py)")
    wandb: bool = option(False, "also log the configurations to wandb (offline)")
    wandb_project: str = option("mhalab")
    plots: bool = option(True, "the pictures (--no-plots: none)")
    table: bool = option(False, "print a table of experiments/README.md instead: the experiments table from "
                                "report.json files (experiments/*/results/report.json), or the verdicts table from "
                                "stability.json files (experiments/**/stability.json)")
    numerics: bool = option(False, "compare the given report.json files (or ablation.json) of one design under "
                                   "different numerics, each as NAME:path (or a path in report-NAME/): each "
                                   "verdict stable or flipping (stability.md)")
