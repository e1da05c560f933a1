"""`mhalab <command> ...`: one command for everything, in the manner of litgpt's CLI.

A command is one typed function taking its options dataclass, and one entry in `COMMANDS`; its command line is
made from the dataclass (`mhalab.options`). The entry names both by "module:name" and this module imports them only
when the command runs, so `mhalab <command> --help` answers without importing torch. `train` takes Hydra overrides
and parses its own. `python -m mhalab.<command>` runs the same code. Errors in arguments are one sentence and exit
status 2.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import sys
from typing import NamedTuple


class Command(NamedTuple):
    run: str  # "module:function": the command, called with its options; returns an exit status or a result dict
    options: str | None  # "module:dataclass" of its options; None: `run` parses its own arguments (train)
    help: str


COMMANDS: dict[str, Command | dict[str, Command]] = {  # the one place a command is declared
    "train": Command("mhalab.training.train:main", None,
                     "train an encoder (Hydra overrides such as attention=gqa; -m for sweeps)"),
    "report": Command("mhalab.report.command:report_command", "mhalab.report.options:ReportOptions",
                      "tables, paired confidence intervals and plots of sweeps"),
    "ablate": Command("mhalab.analysis.ablate:ablate_command", "mhalab.analysis.options:AblateOptions",
                      "single-head ablation, importance and pruning curves of checkpoints"),
    "convert": Command("mhalab.analysis.convert:convert_command", "mhalab.analysis.options:ConvertOptions",
                       "MHA -> GQA conversion with uptraining and controls"),
    "plots": Command("mhalab.analysis.plots:plots_command", "mhalab.analysis.options:PlotsOptions",
                     "redraw a run's pictures into a new folder"),
    "bench": {
        "complexity": Command("mhalab.bench.complexity:run_complexity", "mhalab.bench.config:ComplexityConfig",
                              "attention cost vs n, equal-cost heads, KV-cache decoding"),
        "train": Command("mhalab.bench.throughput:run_train", "mhalab.bench.config:ThroughputConfig",
                         "training throughput, mhalab vs torch.nn.TransformerEncoder, and the statistics pass's cost"),
        "startup": Command("mhalab.bench.startup:run_startup", "mhalab.bench.config:StartupConfig",
                           "a tiny 1-step run against `import torch, lightning`: a run's cost beyond its imports"),
        "overhead": Command("mhalab.bench.overhead:run_overhead", "mhalab.bench.config:OverheadConfig",
                            "a run's training step against a plain PyTorch loop on the same model and batches"),
        "pace": Command("mhalab.bench.pace:run_pace", "mhalab.bench.config:PaceConfig",
                        "runs per hour: the step, a 1-step job and a short sweep against plain PyTorch, one table"),
        "gpu": Command("mhalab.bench.gpu:run_gpu", "mhalab.bench.config:GpuConfig",
                       "the GPU check: tests, training, throughput and MFU, complexity, decoding, report "
                       "(--dry-run: CPU)"),
    },
}
HELP = {"bench": "cost benchmarks: complexity, training throughput, the GPU check"}  # groups of subcommands
EXAMPLES = {"bench": """examples:
  mhalab bench complexity --threads 1 --grid.n [64,128,256] --backends math --sections scaling
  mhalab bench train threads=1 n_heads=[4,8] rounds=11 out_dir=outputs/bench/train   # key=value is --key value
  mhalab bench overhead --threads 1 --rounds 7     # the kv_sweep job's step against a plain loop
  mhalab bench pace --threads 1                    # the step, a 1-step job and a 6-job sweep: one table
  mhalab bench gpu --out experiments/gpu/h100      # on a CUDA machine
  mhalab bench gpu --dry-run --out /tmp/gpu-dry    # the same command on the CPU, tiny shapes, no GPU figures
  mhalab bench train --cfg                         # every option of a subcommand with its value"""}


def load(target: str):
    """The object "module:name" names, imported now."""
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def usage(path: list[str], table: dict) -> str:
    from mhalab import __version__

    name = " ".join(["mhalab", *path])
    width = max(map(len, table))
    lines = [f"usage: {name} {{{','.join(table)}}} [arguments]   (mhalab {__version__})", "",
             "subcommands:" if path else "commands:"]
    lines += [f"  {n:<{width}}  {c.help if isinstance(c, Command) else HELP[n]}" for n, c in table.items()]
    lines += ["", f"`{name} <{'sub' if path else ''}command> --help` describes one."]
    return "\n".join(lines + (["", EXAMPLES[path[0]]] if path and path[0] in EXAMPLES else []))


def run_command(argv: list[str]) -> int:
    """Find the command `argv` names, parse the rest for it, run it; returns the exit status (2: a usage or config
    error, one sentence on stderr)."""
    from mhalab.errors import ConfigError

    table, path = COMMANDS, []
    while isinstance(table, dict):
        if not argv or argv[0] in ("-h", "--help"):
            print(usage(path, table))
            return 0 if argv else 2
        if argv[0] not in table:
            print(f"error: unknown {'sub' if path else ''}command {argv[0]!r}; {'sub' if path else ''}commands are "
                  f"{', '.join(table)}\n\n{usage(path, table)}", file=sys.stderr)
            return 2
        path.append(argv[0])
        table, argv = table[argv[0]], argv[1:]
    command = table
    if command.options is None:  # train: Hydra's overrides, its own parser
        return pass_through(command, path, argv)
    from mhalab import options

    cls = load(command.options)
    try:
        opts = options.parse(cls, [a for a in argv if a != "--cfg"], prog=" ".join(["mhalab", *path]))
        if "--cfg" in argv:
            print(options.to_yaml(opts))
            return 0
        settle(opts)
        result = load(command.run)(opts)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # --help
        return e.code or 0
    return int(result.get("exit_status", 0)) if isinstance(result, dict) else int(result or 0)


def settle(opts) -> None:
    """What a command's options set for the whole process, before it runs: torch's threads (`--threads`) and the
    packages whose task classes a run read back may name (`--allow`; mhalab.targets)."""
    from mhalab.options import Threads

    if isinstance(opts, Threads):
        opts.apply_threads()
    if getattr(opts, "allow", None):
        from mhalab.targets import grant

        grant(opts.allow)


def pass_through(command: Command, path: list[str], argv: list[str]) -> int:
    """Run a command that parses its own arguments (`train`) as if started as `python -m <its module>`."""
    module = importlib.import_module(command.run.split(":")[0])
    # a process that starts this one again (Lightning's DDP launcher for rank 1 and up) runs
    # `python -m <module> ...` from __main__'s spec; without one it would run a file named "mhalab train"
    sys.modules["__main__"].__spec__ = module.__spec__
    sys.argv = [" ".join(["mhalab", *path])] + argv
    return load(command.run)(argv) or 0


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("-V", "--version"):
        from mhalab import __version__

        print(__version__)
        return
    with quick_exit():
        code = run_command(argv)
    if code:
        sys.exit(code)


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
