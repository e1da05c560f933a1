"""`mhalab bench {complexity,train,startup,overhead,gpu} [key=value ...]`: benchmarks of the cost claims, on the machine at hand.

    complexity  one attention layer against n (FLOPs counted and in closed form, time, peak memory, log-log fits),
                equal-cost heads (fixed n_heads x d_head), KV-cache decoding from MHA to MQA   (complexity.py)
    train       training steps of the mhalab model against torch.nn.TransformerEncoder, and the cost of the
                statistics callback's pass                                                   (throughput.py)
    startup     a tiny 1-step `mhalab train` against `import torch, lightning`: what a run costs beyond its
                imports, which every job of a sweep pays                                      (startup.py)
    overhead    a real run's training step against a plain PyTorch loop on the same model and batches, with
                both fractions of the matmul peak measured in the same rounds                (overhead.py)
    gpu         the GPU check: tests, training runs, throughput with MFU, complexity and decoding at GPU sizes,
                and a report, into one folder; `dry_run=true` runs it on the CPU with tiny shapes  (gpu.py)

Settings are dataclasses (config.py) overridden with OmegaConf dotlist syntax (`grid.n=[64,128] backends=[math]`);
`--cfg` prints them. An unknown key or a bad value is one sentence on stderr and exit status 2. This module parses
before it imports torch, so `--help` answers at once.
"""

from __future__ import annotations

import sys

SUBCOMMANDS = {
    "complexity": "attention cost vs n, equal-cost heads, KV-cache decoding",
    "train": "training throughput, mhalab vs torch.nn.TransformerEncoder, and the statistics pass's cost",
    "startup": "a tiny 1-step run against `import torch, lightning`: a run's cost beyond its imports",
    "overhead": "a run's training step against a plain PyTorch loop on the same model and batches",
    "gpu": "the GPU check: tests, training, throughput and MFU, complexity, decoding, report (dry_run=true: CPU)",
}

USAGE = """usage: mhalab bench {complexity,train,startup,overhead,gpu} [key=value ...] [--cfg]

  complexity  attention cost vs n, equal-cost heads, KV-cache decoding
  train       training throughput, mhalab vs torch.nn.TransformerEncoder, and the statistics pass's cost
  startup     a tiny 1-step run against `import torch, lightning`: a run's cost beyond its imports
  overhead    a run's training step (kv_sweep recipe) against a plain PyTorch loop, with fractions of peak
  gpu         the GPU check into one folder: tests, training, throughput and MFU, complexity, decoding, report

examples:
  mhalab bench complexity threads=1 grid.n=[64,128,256] backends=[math] sections=[scaling]
  mhalab bench train threads=1 n_heads=[4,8] rounds=11 out_dir=outputs/bench/train
  mhalab bench startup rounds=7
  mhalab bench overhead threads=1 rounds=7           # the kv_sweep job's step against a plain loop
  mhalab bench gpu out=experiments/gpu/h100        # on a CUDA machine
  mhalab bench gpu dry_run=true out=/tmp/gpu-dry   # the same command on the CPU, tiny shapes, no GPU figures
  mhalab bench train --cfg                         # every key of a subcommand with its default"""


def run(sub: str, cfg):
    """Run subcommand `sub` with its parsed config; returns its result dict."""
    if sub == "complexity":
        from mhalab.bench.complexity import run_complexity

        return run_complexity(cfg)
    if sub == "train":
        from mhalab.bench.throughput import run_train

        return run_train(cfg)
    if sub == "startup":
        from mhalab.bench.startup import run_startup

        return run_startup(cfg)
    if sub == "overhead":
        from mhalab.bench.overhead import run_overhead

        return run_overhead(cfg)
    from mhalab.bench.gpu import run_gpu

    return run_gpu(cfg)


def main(argv: list[str] | None = None) -> int:
    """The CLI; returns the exit status: 0 ok, 2 a config error (or no CUDA device for `gpu`), 1 a failed `gpu`
    step."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    sub, overrides = argv[0], argv[1:]
    if sub not in SUBCOMMANDS:
        print(f"error: unknown subcommand {sub!r}; subcommands are {', '.join(SUBCOMMANDS)}\n\n{USAGE}",
              file=sys.stderr)
        return 2
    if "-h" in overrides or "--help" in overrides:
        print(USAGE)
        return 0
    from mhalab.bench.config import parse, to_yaml
    from mhalab.errors import ConfigError

    try:
        cfg = parse(sub, [o for o in overrides if o != "--cfg"])
        if "--cfg" in overrides:
            print(to_yaml(cfg))
            return 0
        result = run(sub, cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return int(result.get("exit_status", 0))


if __name__ == "__main__":
    sys.exit(main())
