"""What a training command prints: `mhalab train --help`, the header of a run, a warning about repeated data, and
the final line (stdout and train.log, through the `mhalab` logger)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from omegaconf import OmegaConf

from mhalab.errors import ConfigError
from mhalab.runs.summary import RunSummary

log = logging.getLogger("mhalab")


# Lightning's warnings that say nothing about a run of mhalab: a deprecation inside Lightning, few workers (a
# choice), a short epoch, a resumed run writing where it wrote before, and `srun` installed (a SLURM login node or a
# one-task job, where mhalab needs no srun)
_NOISE = (r".*isinstance\(treespec, LeafSpec\)` is deprecated.*", r".*does not have many workers.*",
          r".*The number of training batches .* is smaller than the logging interval.*",
          r".*Checkpoint directory .* exists and is not empty.*", r".*The `srun` command is available on your system.*",
          r".*You defined a `validation_step` but have no `val_dataloader`.*")


def quiet_lightning() -> None:
    """Silence Lightning's noise (above) and its INFO banners (devices found, tips, restores) in this process."""
    import warnings

    for pattern in _NOISE:
        warnings.filterwarnings("ignore", message=pattern)
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)


def each_with_progress(command: str, items: list, what: str = "checkpoint"):
    """Yield the items, saying on stderr which one starts and how long the command has run (a long analysis
    command is never silent)."""
    import time

    t0, n = time.perf_counter(), len(items)
    for i, item in enumerate(items, 1):
        print(f"{command}: {what} {i}/{n} ({time.perf_counter() - t0:.0f} s so far): {item}", file=sys.stderr,
              flush=True)
        yield item


def usage(argv: list[str]) -> str:
    """`mhalab train --help`: the groups and their options, where the keys are defined, and the composed config
    for the given overrides. (Hydra's own help deep-copies the schema once per group: seconds; this: a fraction.)"""
    from importlib.resources import files

    from mhalab.config.compose import parse_args
    from mhalab.runs.preflight import compose

    args = parse_args([a for a in argv if a not in ("--help", "-h")])
    conf = files("mhalab.conf")
    dirs = [(g.name, g) for g in conf.iterdir() if g.is_dir() and not g.name.startswith("_") and g.name != "hydra"]
    dirs += [(f"hydra/{g.name}", g) for g in conf.joinpath("hydra").iterdir() if g.is_dir()]
    groups = {name: sorted(f.name.removesuffix(".yaml") for f in g.iterdir() if f.name.endswith(".yaml"))
              for name, g in dirs}
    if args.config_dir:
        for g in Path(args.config_dir).iterdir():
            if g.is_dir():
                groups.setdefault(g.name, [])
                groups[g.name] = sorted(set(groups[g.name]) | {f.stem for f in g.glob("*.yaml")})
    lines = ["usage: mhalab train [--config-dir DIR] [-m] [group=option ...] [key=value ...]", "",
             "Train a transformer encoder around one configurable attention layer (README, Recipes).", "",
             "Config groups (group=option):"]
    lines += [f"  {name:<15} {', '.join(options)}" for name, options in sorted(groups.items())]
    lines += ["", "Every key, its type, default and allowed values: mhalab/config/schema.py (TrainConfig).",
              "Sweeps: -m key=a,b,c; resume: resume=true or resume=<run_dir>; Hydra's flags: --hydra-help.", "",
              "== Config ==" + (f" (with {' '.join(args.overrides)})" if args.overrides else "")]
    try:
        cfg = compose(args.overrides, args.config_dir, args.config_name)
        lines.append(OmegaConf.to_yaml(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])))
    except ConfigError as e:
        lines.append(f"error: {e}")
    return "\n".join(lines)


def header(dm, arch, cost: dict, run_dir: Path) -> str:
    """The console's short description of a run."""
    m, a = arch.model, arch.attention
    kind = "MHA" if a.n_kv_heads == a.n_heads else "MQA" if a.n_kv_heads == 1 else f"GQA-{a.n_kv_heads}"
    classes = f", {arch.n_classes} classes" if arch.n_classes else ""
    return (f"mhalab: task {dm.task} ({arch.objective}{classes}) | {m.n_layers} layers, d_model {m.d_model}, "
            f"{a.n_heads} heads x {a.d_head} ({kind}), d_ff {m.d_ff} | {cost['params'] / 1e6:.2f} M parameters, "
            f"{cost['flops_per_token'] / 1e6:.3g} MFLOPs/token | run directory {run_dir}")


MAX_EPOCHS_WITHOUT_WARNING = 10  # the default run makes 1 pass (topic classification: 6); old GPU recipes 170


def warn_if_repeating(tc, dm) -> None:
    """A recipe that passes over a small training set many times measures memorisation: say so up front."""
    batches = len(dm.train_dataloader())
    limit = tc.trainer.limit_train_batches
    if isinstance(limit, float):
        batches = int(batches * limit)
    elif isinstance(limit, int):
        batches = min(batches, limit)
    steps_per_epoch = max(1, batches // tc.trainer.accumulate_grad_batches)
    max_epochs = tc.trainer.max_epochs if tc.trainer.max_epochs not in (None, -1) else float("inf")
    steps = min(tc.trainer.max_steps if tc.trainer.max_steps != -1 else float("inf"), max_epochs * steps_per_epoch)
    epochs = steps / steps_per_epoch
    if epochs > MAX_EPOCHS_WITHOUT_WARNING:
        log.warning("this run makes %.0f passes over its %d training examples (%d steps of %d per epoch): beyond a "
                    "few epochs a small corpus is memorised; give more data or fewer steps", epochs,
                    len(dm.datasets["train"]), steps, steps_per_epoch)


def result_line(summary: RunSummary, run_dir: Path) -> str:
    """One line to end a run with: the headline metrics, the time, and where everything is."""
    keys = ("val/acc", "val/bpb", "val/loss", "test/acc", "test/bpb")
    found = {k: v for k, v in {**summary.metrics, **summary.test_metrics}.items() if k in keys and v is not None}
    metrics = ", ".join(f"{k} {found[k]:.4f}" for k in keys if k in found)
    took = summary.timings.get("total_s")
    pictures = f"; pictures in {Path(run_dir) / 'plots'}" if summary.plots else ""
    return (f"mhalab: done{f' in {took:.0f} s' if took else ''}: {metrics}; results in "
            f"{Path(run_dir) / 'summary.json'}{pictures}")
