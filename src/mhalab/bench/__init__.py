"""`mhalab bench {complexity,train,startup,overhead,pace,gpu} [options]`: benchmarks of the cost claims, on the
machine at hand.

    complexity  one attention layer against n (FLOPs counted and in closed form, time, peak memory, log-log fits),
                equal-cost heads (fixed n_heads x d_head), KV-cache decoding from MHA to MQA   (complexity.py)
    train       training steps of the mhalab model against torch.nn.TransformerEncoder, and the cost of the
                statistics callback's pass                                                   (throughput.py)
    startup     a tiny 1-step `mhalab train` against `import torch, lightning`: what a run costs beyond its
                imports, which every job of a sweep pays                                      (startup.py)
    overhead    a real run's training step against a plain PyTorch loop on the same model and batches, with
                both fractions of the matmul peak measured in the same rounds                (overhead.py)
    pace        overhead and startup in one run: the step, the 1-step job and a short sweep against plain
                PyTorch, each against its goal, in one table                                   (pace.py)
    gpu         the GPU check: tests, training runs, throughput with MFU, complexity and decoding at GPU sizes,
                and a report, into one folder; `--dry-run` runs it on the CPU with tiny shapes  (gpu.py)

Each subcommand is one entry of `mhalab.cli.COMMANDS`: its function and its options, a dataclass of config.py, whose
fields are its options (`--grid.n [64,128] --backends math`, or `grid.n=[64,128] backends=[math]`); `--cfg` prints
them. An unknown option or a bad value is one sentence on stderr and exit status 2.
"""
