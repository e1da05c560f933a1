"""The options of `mhalab ablate`, `convert` and `plots` (their command lines: `mhalab.options`). Torch-free, so
`--help` answers at once; the commands themselves are `ablate_command`, `convert_command` and `plots_command`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

from mhalab.options import Threads, option

Split = Literal["validation", "test"]
ALLOW = ("grant your package, whose task class the run's summary.json names (also MHALAB_ALLOW); the grant comes "
         "from this command line, never from the run's files")


@dataclass
class AblateOptions(Threads):
    """single-head ablation, importance and pruning curves of checkpoints"""

    checkpoints: list[Path] = option(positional=True, help="checkpoints written by mhalab train (several: one per "
                                                           "seed, aggregated)")
    out: Optional[Path] = option(None, "output folder (default <first run_dir>/ablation)")
    importance_split: Split = option("validation", "the split importance is scored on")
    eval_split: Split = option("test", "the split ablations and pruning curves are evaluated on")
    batches: int = option(20, "batches of each split (0 = the whole split)")
    batch_size: Optional[int] = option(None, "default: the run's data.batch_size")
    step: float = option(0.1, "fraction of all heads pruned per step, in (0, 1]")
    random_orders: int = option(10, "random pruning orders for the baseline band")
    prune: bool = option(True, "the pruning curves (--no-prune skips them)")
    seed: int = option(0, "seed of the random pruning orders")
    allow: list[str] = option([], ALLOW, metavar="PKG")


@dataclass
class ConvertOptions(Threads):
    """MHA -> GQA conversion with uptraining and controls"""

    checkpoints: list[Path] = option(positional=True, help="MHA (or GQA) source checkpoints, one per seed")
    n_kv_heads: int = option(help="KV heads of the converted model")
    init: list[str] = option(["mean", "first", "random"], "comma-separated: mean, first, random")
    uptrain_fraction: float = option(0.05, "fraction of the original training steps")
    scratch: list[str] = option(["budget", "total"], "comma-separated: budget (GQA from scratch for the uptraining "
                                                     "steps), total (for the converted model's total steps), or none")
    mha_control: bool = option(True, "also train each MHA source for the same extra steps (the same total steps as "
                                     "uptraining)")
    out: Optional[Path] = option(None, "output folder")
    split: Split = option("test", "the split results are reported on")
    batches: int = option(0, "evaluation batches (0: the whole split)")
    seed: int = option(0)
    lr: Optional[float] = option(None, "uptraining peak lr (default: the run's optim.lr)")
    margin: Optional[float] = option(None, "equivalence margin on the metric, declared before the run: mean-pool vs "
                                           "the MHA control is tested with TOST against +-margin")
    allow: list[str] = option([], ALLOW, metavar="PKG")


@dataclass
class PlotsOptions:
    """redraw a run's pictures into a new folder"""

    run_dir: Path = option(positional=True, help="run directory holding summary.json")
    out: Optional[Path] = option(None, "output folder (default: <run_dir>/plots-redrawn-<time>; the training "
                                       "pictures are kept)")
    checkpoint: Optional[Path] = option(None, "checkpoint for the attention maps (default: the one the run tested)")
    maps: bool = option(True, "the attention maps (--no-maps: only the statistic heatmaps, no checkpoint needed)")
    html: bool = option(False, "also attention.html: every head, interactive (hover a token), self-contained")
    max_tokens: int = option(32, "tokens shown in the attention maps (2-512)")
    allow: list[str] = option([], ALLOW, metavar="PKG")
