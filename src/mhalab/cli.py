"""`mhalab <command> ...`: one command for everything, in the manner of litgpt's CLI.

This module holds every command's arguments and imports the module that does the work only after parsing them,
so `mhalab <command> --help` answers at once. `train` and `bench` take config overrides (`key=value`) and parse
their own; `python -m mhalab.<command>` runs the same code. Arguments may also be written `key=value`
(`split=test` is `--split test`). Errors in arguments are one sentence and exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import sys
from pathlib import Path

COMMANDS = {
    "train": "train an encoder (Hydra overrides such as attention=gqa; -m for sweeps)",
    "report": "tables, paired confidence intervals and plots of sweeps",
    "ablate": "single-head ablation, importance and pruning curves of checkpoints",
    "convert": "MHA -> GQA conversion with uptraining and controls",
    "plots": "redraw a run's pictures into a new folder",
    "bench": "cost benchmarks: complexity, training throughput, the GPU check",
}
PASS_THROUGH = {"train": "mhalab.training.train", "bench": "mhalab.bench"}  # they parse their own arguments
MODULES = {"report": "mhalab.report", "ablate": "mhalab.analysis.ablate", "convert": "mhalab.analysis.convert",
           "plots": "mhalab.analysis.plots"}  # the commands this module parses, and where each one's work is


def _threads(p: argparse.ArgumentParser) -> None:
    """`--threads N` (ablate, convert): torch's threads, set by `run_command` before the command runs."""
    p.add_argument("--threads", type=int, default=None, help="torch threads (1 is fastest on a small, busy CPU)")


def _allow(p: argparse.ArgumentParser) -> None:
    """`--allow PKG` (plots, ablate, convert): a run read back may name a class of PKG (its own data.source task);
    the grant comes from this command line or MHALAB_ALLOW, never from the run's files (mhalab.targets)."""
    p.add_argument("--allow", action="append", default=[], metavar="PKG",
                   help="grant your package, whose task class the run's summary.json names (also MHALAB_ALLOW)")


def _report(p: argparse.ArgumentParser) -> None:
    p.add_argument("dirs", nargs="+", type=Path, help="multirun directories (or any folders holding summary.json)")
    p.add_argument("--out", type=Path, help="output folder (default <first dir>/report)")
    p.add_argument("--metric", help="a key of the summaries' metrics (default val/acc for classification, val/bpb "
                                    "for text language modelling)")
    p.add_argument("--baseline", help="the arm every other one is compared with, e.g. "
                                      "'attention.n_kv_heads=8' (default: the first arm)")
    p.add_argument("--wandb", action="store_true", help="also log the configurations to wandb (offline)")
    p.add_argument("--wandb-project", default="mhalab")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--table", action="store_true", help="print the experiments table of README.md from the given "
                                                        "report.json files instead (experiments/*/results/report.json)")


def _ablate(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoints", nargs="+", type=Path,
                   help="checkpoints written by mhalab train (several: one per seed, aggregated)")
    p.add_argument("--out", type=Path, help="output folder (default <first run_dir>/ablation)")
    p.add_argument("--importance-split", default="validation", choices=["validation", "test"],
                   help="the split importance is scored on")
    p.add_argument("--eval-split", default="test", choices=["validation", "test"],
                   help="the split ablations and pruning curves are evaluated on")
    p.add_argument("--batches", type=int, default=20, help="batches of each split (0 = the whole split)")
    p.add_argument("--batch-size", type=int, default=None, help="default: the run's data.batch_size")
    p.add_argument("--step", type=float, default=0.1, help="fraction of all heads pruned per step, in (0, 1]")
    p.add_argument("--random-orders", type=int, default=10, help="random pruning orders for the baseline band")
    p.add_argument("--no-prune", action="store_true", help="skip the pruning curves")
    p.add_argument("--seed", type=int, default=0, help="seed of the random pruning orders")
    _threads(p)
    _allow(p)


def _convert(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoints", nargs="+", type=Path, help="MHA (or GQA) source checkpoints, one per seed")
    p.add_argument("--n-kv-heads", type=int, required=True, help="KV heads of the converted model")
    p.add_argument("--init", default="mean,first,random", help="comma-separated: mean, first, random")
    p.add_argument("--uptrain-fraction", type=float, default=0.05, help="fraction of the original training steps")
    p.add_argument("--scratch", default="budget,total",
                   help="comma-separated: budget (GQA from scratch for the uptraining steps), total (for the "
                        "converted model's total steps), or none")
    p.add_argument("--mha-control", action=argparse.BooleanOptionalAction, default=True,
                   help="also train each MHA source for the same extra steps (the same total steps as uptraining)")
    p.add_argument("--out", type=Path)
    p.add_argument("--split", default="test", choices=["validation", "test"], help="the split results are reported on")
    p.add_argument("--batches", type=int, default=0, help="evaluation batches (default 0: the whole split)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=None, help="uptraining peak lr (default: the run's optim.lr)")
    p.add_argument("--margin", type=float, default=None,
                   help="equivalence margin on the metric, declared before the run: mean-pool vs the MHA control is "
                        "tested with TOST against +-margin")
    _threads(p)
    _allow(p)


def _plots(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, help="run directory holding summary.json")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: <run_dir>/plots-redrawn-<time>; the training pictures are kept)")
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="checkpoint for the attention maps (default: the one the run tested)")
    p.add_argument("--no-maps", action="store_true", help="only the statistic heatmaps, no checkpoint needed")
    p.add_argument("--html", action="store_true",
                   help="also attention.html: every head, interactive (hover a token), self-contained")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens shown in the attention maps (2-512)")
    _allow(p)


PARSERS = {"report": _report, "ablate": _ablate, "convert": _convert, "plots": _plots}


def parser(command: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"mhalab {command}", description=COMMANDS[command])
    PARSERS[command](p)
    return p


def kv_args(argv: list[str], p: argparse.ArgumentParser | None = None) -> list[str]:
    """`key=value` arguments become `--key value` (dashes for underscores); paths are left alone, and so is the
    value of an option of `p` that takes one (`--baseline seed=0` compares with the arm seed=0)."""
    takes_value = {o for o, action in (p._option_string_actions.items() if p else ()) if action.nargs != 0}
    out = []
    for i, a in enumerate(argv):
        key = a.split("=", 1)[0]
        if "=" in a and not a.startswith("-") and key.replace("_", "").replace("-", "").isalnum() \
                and not Path(a).exists() and not (i and argv[i - 1] in takes_value):
            out += [f"--{key.replace('_', '-')}", a.split("=", 1)[1]]
        else:
            out.append(a)
    return out


def run_command(command: str, argv: list[str]) -> int:
    """Parse `argv` for `command`, then import its module and run it; returns the exit status."""
    p = parser(command)
    args = p.parse_args(kv_args(argv, p))
    from mhalab.errors import ConfigError

    module = importlib.import_module(MODULES[command])
    try:
        if getattr(args, "allow", None):
            from mhalab.targets import grant

            grant([pkg for a in args.allow for pkg in a.split(",")])
        if getattr(args, "threads", None) is not None:
            import torch

            from mhalab.checks import check_int

            check_int("--threads", args.threads, 1, 4096)
            torch.set_num_threads(args.threads)
        return module.run_cli(args) or 0
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def command_main(command: str, argv: list[str] | None = None) -> None:
    """`python -m <the command's module> ...` (each module's `main`): `run_command` on the process's arguments, and
    its exit status when it is not 0."""
    code = run_command(command, sys.argv[1:] if argv is None else argv)
    if code:
        sys.exit(code)


def usage() -> str:
    from mhalab import __version__

    width = max(map(len, COMMANDS))
    lines = [f"usage: mhalab <command> [arguments]   (mhalab {__version__})", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, text in COMMANDS.items()]
    lines += ["", "`mhalab <command> --help` describes a command."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        sys.exit(0 if argv else 2)
    if argv[0] in ("-V", "--version"):
        from mhalab import __version__

        print(__version__)
        return
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"error: unknown command {command!r}; commands are {', '.join(COMMANDS)}\n\n{usage()}", file=sys.stderr)
        sys.exit(2)
    if command in PASS_THROUGH:
        module = importlib.import_module(PASS_THROUGH[command])
        # a process that starts this one again (Lightning's DDP launcher for rank 1 and up) runs
        # `python -m <module> ...` from __main__'s spec; without one it would run a file named "mhalab train"
        sys.modules["__main__"].__spec__ = module.__spec__
        sys.argv = [f"mhalab {command}"] + rest
        with quick_exit():
            sys.exit(module.main(rest))
    with quick_exit():
        sys.exit(run_command(command, rest))


@contextlib.contextmanager
def quick_exit():
    """When the command is done, also on an error, freeze what it allocated (`gc.freeze`): the interpreter's
    last collections then skip it, which takes about 0.8 s of CPU after importing torch and Lightning (measured
    with `mhalab bench startup`'s baseline on this project's 2-core machine). Files, loggers and wandb are
    closed before (their own teardown and atexit handlers still run)."""
    try:
        yield
    finally:
        gc.freeze()


if __name__ == "__main__":
    main()
