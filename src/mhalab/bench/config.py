"""The settings of every benchmark: dataclasses holding each key's default and checks, in one place.

Each is a subcommand's options: `mhalab.cli` parses the command line into one (`mhalab.options`: `--grid.n [64,128]`,
or `grid.n=[64,128]`). A value out of range is a `ConfigError`: one sentence naming the key. This module imports no
torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from mhalab.checks import check_choice, check_int, check_number
from mhalab.errors import ConfigError
from mhalab.architecture import BACKENDS
from mhalab.config.schema import StatsConfig
from mhalab.options import Threads

DTYPES = ("float32", "bfloat16", "float16")
SECTIONS = ("scaling", "equal_cost", "decode")
SDPA_KERNELS = ("flash", "efficient", "cudnn", "math")
GPU_STEPS = ("tests", "train", "throughput", "complexity", "decode")


def _device(value: str) -> None:
    if not (value in ("auto", "cpu") or value == "cuda" or (value.startswith("cuda:") and value[5:].isdigit())):
        raise ConfigError(f"device={value!r}: device must be auto, cpu or cuda[:i]")


def _positive_ints(key: str, values) -> None:
    if not values:
        raise ConfigError(f"{key}=[]: {key} needs at least one value")
    for v in values:
        check_int(key, v, 1)


@dataclass
class MachineConfig(Threads):
    """Keys every subcommand shares (and `threads`: torch's threads; on a small shared CPU use 1, README)."""

    out_dir: Optional[str] = None  # default outputs/bench/<subcommand>-<timestamp>
    device: str = "auto"  # auto | cpu | cuda[:i]
    seed: int = 0
    plots: bool = True

    def __post_init__(self):
        super().__post_init__()
        _device(self.device)
        check_int("seed", self.seed, 0)


# -- complexity ------------------------------------------------------------------------------------------------

@dataclass
class GridConfig:
    """scaling: one attention layer, the cartesian product of these lists."""

    n: List[int] = field(default_factory=lambda: [64, 128, 256, 512, 1024, 2048, 4096])
    d_model: List[int] = field(default_factory=lambda: [256])
    n_heads: List[int] = field(default_factory=lambda: [4])
    d_head: List[Optional[int]] = field(default_factory=lambda: [None])  # None = d_model // n_heads
    n_kv_heads: List[Optional[int]] = field(default_factory=lambda: [None])  # None = n_heads
    batch: List[int] = field(default_factory=lambda: [1])

    def __post_init__(self):
        for key in ("n", "d_model", "n_heads", "batch"):
            _positive_ints(f"grid.{key}", getattr(self, key))
        for key in ("d_head", "n_kv_heads"):
            _positive_ints(f"grid.{key}", [v for v in getattr(self, key) if v is not None] or [1])


@dataclass
class EqualCostConfig:
    """equal_cost: n_heads x d_head = width fixed, so the matmul FLOPs do not depend on n_heads."""

    width: int = 512
    n_heads: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    n: List[int] = field(default_factory=lambda: [256, 1024])
    batch: int = 1

    def __post_init__(self):
        check_int("equal_cost.width", self.width, 1)
        _positive_ints("equal_cost.n_heads", self.n_heads)
        _positive_ints("equal_cost.n", self.n)
        check_int("equal_cost.batch", self.batch, 1)
        bad = [h for h in self.n_heads if self.width % h]
        if bad:
            raise ConfigError(f"equal_cost.n_heads={list(self.n_heads)}: {bad[0]} does not divide equal_cost.width="
                              f"{self.width}")


@dataclass
class DecodeConfig:
    """decode: a causal LanguageModel with a KV cache, single-token steps after `context` cached tokens."""

    d_model: int = 512
    n_heads: int = 8
    n_kv_heads: Optional[List[int]] = None  # None = n_heads, n_heads/2, ..., 1 (MHA -> GQA -> MQA)
    n_layers: int = 2
    d_ff: int = 2048
    vocab_size: int = 1024
    pos: str = "learned"  # learned | sinusoidal | rotary
    batch: List[int] = field(default_factory=lambda: [1, 8])
    context: List[int] = field(default_factory=lambda: [128, 512, 2048])
    steps: int = 24  # timed single-token steps per model, interleaved across n_kv_heads (median reported)
    warmup_steps: int = 3
    check_max_tokens: int = 4096  # compare the first cached step with a full forward when batch * context <= this
    prefill_max_tokens: Optional[int] = None  # fill the cache by a forward pass up to batch * context tokens, with
    #                                           random keys and values beyond (timing only); None = always prefill

    def __post_init__(self):
        for key in ("d_model", "n_heads", "n_layers", "d_ff", "vocab_size", "steps"):
            check_int(f"decode.{key}", getattr(self, key), 1)
        check_int("decode.warmup_steps", self.warmup_steps, 0)
        check_int("decode.check_max_tokens", self.check_max_tokens, 0)
        if self.prefill_max_tokens is not None:
            check_int("decode.prefill_max_tokens", self.prefill_max_tokens, 0)
        check_choice("decode.pos", self.pos, ("learned", "sinusoidal", "rotary"))
        _positive_ints("decode.batch", self.batch)
        _positive_ints("decode.context", self.context)
        if self.d_model % self.n_heads:
            raise ConfigError(f"decode.d_model={self.d_model} is not divisible by decode.n_heads={self.n_heads}")
        for g in self.kv_heads():
            if self.n_heads % g:
                raise ConfigError(f"decode.n_kv_heads: {g} does not divide decode.n_heads={self.n_heads}")

    def kv_heads(self) -> list[int]:
        """The n_kv_heads compared: the configured list, or n_heads halved down to 1."""
        if self.n_kv_heads is not None:
            _positive_ints("decode.n_kv_heads", self.n_kv_heads)
            return list(self.n_kv_heads)
        out, g = [], self.n_heads
        while g > 1:
            if self.n_heads % g == 0:
                out.append(g)
            g //= 2
        return out + [1]


@dataclass
class ComplexityConfig(MachineConfig):
    """`mhalab bench complexity`: attention cost against n, equal-cost heads, KV-cache decoding."""

    dtype: str = "float32"  # float32 | bfloat16 | float16
    warmup: int = 1  # untimed calls of each case before the timed ones
    repeats: int = 7  # timing rounds; each times every case of a section once, interleaved; tables give medians
    min_time_s: float = 0.05  # in a round a case repeats its call until this much time has passed (the mean counts)
    memory: str = "rss"  # rss: peak memory (CPU: peak RSS growth in a fresh process per case; CUDA:
    #                      max_memory_allocated) | none
    free_fraction: float = 0.5  # skip a case whose predicted peak exceeds this fraction of the free memory
    max_case_gib: Optional[float] = None  # and, if set, this many GiB
    sdpa_kernel: Optional[str] = None  # None = torch's choice | flash | efficient | cudnn | math
    sections: List[str] = field(default_factory=lambda: list(SECTIONS))
    backends: List[str] = field(default_factory=lambda: ["math", "sdpa"])  # used by every section
    fit_min_n: Optional[int] = 512  # the headline fit uses n >= fit_min_n (below it the O(n d^2) projections rule)
    grid: GridConfig = field(default_factory=GridConfig)
    equal_cost: EqualCostConfig = field(default_factory=EqualCostConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def __post_init__(self):
        super().__post_init__()
        check_choice("dtype", self.dtype, DTYPES)
        check_int("warmup", self.warmup, 0)
        check_int("repeats", self.repeats, 1)
        check_number("min_time_s", self.min_time_s, 0)
        check_choice("memory", self.memory, ("rss", "none"))
        check_number("free_fraction", self.free_fraction, 0, 1, low_open=True)
        if self.max_case_gib is not None:
            check_number("max_case_gib", self.max_case_gib, 0, low_open=True)
        if self.sdpa_kernel is not None:
            check_choice("sdpa_kernel", self.sdpa_kernel, SDPA_KERNELS)
        for s in self.sections:
            check_choice("sections", s, SECTIONS)
        if not self.backends:
            raise ConfigError("backends=[]: backends needs at least one of " + ", ".join(BACKENDS))
        for b in self.backends:
            check_choice("backends", b, BACKENDS)
        if self.fit_min_n is not None:
            check_int("fit_min_n", self.fit_min_n, 1)


# -- train -----------------------------------------------------------------------------------------------------

@dataclass
class ThroughputConfig(MachineConfig):
    """`mhalab bench train`: training steps of the mhalab model against the same model with its blocks replaced by
    torch.nn.TransformerEncoder, alternating in rounds, and the cost of the statistics callback's pass."""

    n_heads: List[int] = field(default_factory=lambda: [4, 8])  # one comparison per entry (MHA, d_model / n_heads)
    d_model: int = 256
    n_layers: int = 4
    d_ff: int = 1024
    dropout: float = 0.1  # embeddings and residual branches (the training default)
    attn_dropout: float = 0.0  # on the attention weights, the same in both models
    backend: str = "sdpa"  # mhalab attention backend of the training steps
    norm: str = "pre"  # pre | post
    pos: str = "learned"  # learned | sinusoidal (torch's layer has no rotary positions)
    objective: str = "mlm"  # mlm: token-level LM head on every position | classification: pooling + classifier
    pooling: str = "mean"  # classification: mean | cls
    vocab_size: int = 1000
    n_classes: int = 4  # classification only
    seq_len: int = 128
    batch: int = 16
    lr: float = 1.0e-3
    warmup_steps: int = 2  # untimed steps per model
    rounds: int = 7  # alternating rounds; medians over rounds
    steps_per_round: int = 3
    compile: bool = False  # torch.compile both models
    compile_backend: str = "inductor"  # torch.compile's backend (eager: tracing only, for quick checks)
    amp_bf16: bool = False  # bf16 autocast for the training steps (the statistics pass runs outside it, as in a run)
    peak_matmul_size: Optional[int] = None  # MFU denominator: best-of-10 GEMM of this size (None: 3072 CPU, 8192 GPU)
    stats: StatsConfig = field(default_factory=StatsConfig)  # the training run's statistics settings

    def __post_init__(self):
        super().__post_init__()
        _positive_ints("n_heads", self.n_heads)
        for key in ("d_model", "n_layers", "d_ff", "vocab_size", "seq_len", "batch", "rounds", "steps_per_round"):
            check_int(key, getattr(self, key), 1)
        check_int("n_classes", self.n_classes, 2)
        check_int("warmup_steps", self.warmup_steps, 0)
        for key in ("dropout", "attn_dropout"):
            check_number(key, getattr(self, key), 0, 1, high_open=True)
        check_number("lr", self.lr, 0, low_open=True)
        check_choice("backend", self.backend, BACKENDS)
        check_choice("norm", self.norm, ("pre", "post"))
        check_choice("pos", self.pos, ("learned", "sinusoidal"))
        check_choice("objective", self.objective, ("mlm", "classification"))
        check_choice("pooling", self.pooling, ("mean", "cls"))
        if self.peak_matmul_size is not None:
            check_int("peak_matmul_size", self.peak_matmul_size, 16)
        bad = [h for h in self.n_heads if self.d_model % h]
        if bad:
            raise ConfigError(f"n_heads={list(self.n_heads)}: {bad[0]} does not divide d_model={self.d_model} "
                              "(torch's encoder layer has heads of d_model / n_heads)")
        if isinstance(self.stats, dict):
            self.stats = StatsConfig(**self.stats)

    def architecture(self, n_heads: int):
        """The Architecture both models of one comparison are built from."""
        from mhalab.architecture import Architecture, AttentionConfig, ModelConfig

        model = ModelConfig(d_model=self.d_model, n_layers=self.n_layers, d_ff=self.d_ff, dropout=self.dropout,
                            norm=self.norm, pos=self.pos, max_len=self.seq_len, pooling=self.pooling)
        attention = AttentionConfig(n_heads=n_heads, backend=self.backend, dropout=self.attn_dropout)
        return Architecture(vocab_size=self.vocab_size, objective=self.objective,
                            n_classes=self.n_classes if self.objective == "classification" else None,
                            model=model, attention=attention)


# -- startup ---------------------------------------------------------------------------------------------------

TINY_RUN = ["setup=mqar_cpu", "trainer.max_steps=1", "model.n_layers=1", "model.d_model=32", "attention.n_heads=2",
            "data.mqar.n_train=256", "data.mqar.n_val=64", "data.mqar.n_test=64"]


@dataclass
class StartupConfig(MachineConfig):
    """`mhalab bench startup`: what a run costs beyond its imports. A tiny 1-step run (`mhalab train` with
    `run_overrides`) against `python -c "import torch, lightning"`, in rounds rotating the order, each a fresh process;
    in a sweep every job pays the difference, the launcher's workers importing once."""

    rounds: int = 5
    run_overrides: List[str] = field(default_factory=lambda: list(TINY_RUN))
    goal: float = 1.25  # the ratio the run should stay within
    sweep_jobs: int = 100  # the preflight of a sweep of this many jobs (the run's overrides, seeds 0..n-1) is timed
    sweep_runs: int = 6  # a sweep of this many runs of sweep_steps steps against the same runs in one plain process
    sweep_steps: int = 100
    sweep_rounds: int = 2  # 0: no sweep figure
    sweep_goal: float = 1.10

    def __post_init__(self):
        super().__post_init__()
        check_int("rounds", self.rounds, 1)
        check_number("goal", self.goal, 1)
        check_int("sweep_jobs", self.sweep_jobs, 1, 10_000)
        check_int("sweep_runs", self.sweep_runs, 1, 1000)
        check_int("sweep_steps", self.sweep_steps, 1)
        check_int("sweep_rounds", self.sweep_rounds, 0)
        check_number("sweep_goal", self.sweep_goal, 1)


# -- overhead ------------------------------------------------------------------------------------------------

@dataclass
class OverheadConfig(MachineConfig):
    """`mhalab bench overhead`: a real run's training step (`mhalab train` on `recipe`, every callback and logger)
    against a plain PyTorch loop on the same model, weights, optimiser and batches, alternating in one process."""

    recipe: List[str] = field(default_factory=lambda: ["experiment=kv_sweep"])
    rounds: int = 7
    steps_per_round: int = 40
    warmup_steps: int = 20
    goal: float = 1.05  # the ratio run / plain the step should stay within
    cache_dir: Optional[str] = None  # the data cache (default: the run's own)
    floor: bool = True  # also time the same plain rounds under a bare Lightning Trainer (Lightning's own floor)

    def __post_init__(self):
        super().__post_init__()
        check_int("rounds", self.rounds, 1)
        check_int("steps_per_round", self.steps_per_round, 1)
        check_int("warmup_steps", self.warmup_steps, 0)
        check_number("goal", self.goal, 1)


# -- pace ------------------------------------------------------------------------------------------------------

@dataclass
class PaceConfig(MachineConfig):
    """`mhalab bench pace`: `bench overhead` and `bench startup` in one run, their three figures in one table."""

    recipe: List[str] = field(default_factory=lambda: list(OverheadConfig().recipe))  # the step's job
    step_rounds: int = OverheadConfig.rounds
    steps_per_round: int = OverheadConfig.steps_per_round
    job_rounds: int = 3  # fewer than `bench startup` alone, and the sweep's rounds more: the sweep is the far goal
    sweep_rounds: int = 3
    sweep_runs: int = StartupConfig.sweep_runs
    sweep_steps: int = StartupConfig.sweep_steps

    def __post_init__(self):
        super().__post_init__()
        for key in ("step_rounds", "steps_per_round", "job_rounds", "sweep_rounds", "sweep_runs", "sweep_steps"):
            check_int(key, getattr(self, key), 1)


# -- gpu -------------------------------------------------------------------------------------------------------

@dataclass
class GpuConfig:
    """`mhalab bench gpu`: the GPU check, everything into one folder (`out`)."""

    out: Optional[str] = None  # default outputs/bench/gpu-<timestamp>
    dry_run: bool = False  # the whole command on the CPU with tiny shapes: checks the command, measures nothing
    budget_s: float = 540.0  # wall time the command aims at; a step that would start after it is skipped, saying so
    steps: List[str] = field(default_factory=lambda: list(GPU_STEPS))
    free_fraction: float = 0.7  # every case sizes itself to this fraction of the free device memory
    train_steps: int = 200  # optimizer steps of each `mhalab train trainer=gpu` run (3 in a dry run)
    train_tasks: Optional[List[str]] = None  # None: the default task, and mqar where mhalab.data.config.TASKS has it
    train_overrides: List[str] = field(default_factory=list)  # added to every `mhalab train` call
    stats_every_n_steps: int = 500  # throughput: the statistics pass's interval, as the MQAR setups run it
    #                                  (mqar_gpu, mqar_cpu; lm_gpu 1000); the pass itself is timed alone
    d_models: List[int] = field(default_factory=lambda: [1024, 512])  # throughput sizes (heads of 64, d_ff 4 d),
    #                                                                     the first measured first
    n_layers: int = 8
    seq_len: int = 1024
    max_batch: int = 64  # throughput batch: the largest power of two up to this that fits
    compile: List[bool] = field(default_factory=lambda: [False, True])
    max_n: int = 32768  # complexity: n = 512, 1024, ..., max_n
    decode_batch: List[int] = field(default_factory=lambda: [1, 8, 64])
    decode_context: List[int] = field(default_factory=lambda: [2048, 8192, 32768])

    def __post_init__(self):
        check_number("budget_s", self.budget_s, 0, low_open=True)
        for s in self.steps:
            check_choice("steps", s, GPU_STEPS)
        check_number("free_fraction", self.free_fraction, 0, 1, low_open=True)
        for key in ("train_steps", "n_layers", "seq_len", "max_batch", "max_n", "stats_every_n_steps"):
            check_int(key, getattr(self, key), 1)
        for key in ("d_models", "decode_batch", "decode_context"):
            _positive_ints(key, getattr(self, key))
        bad = [d for d in self.d_models if d % 64]
        if bad:
            raise ConfigError(f"d_models={list(self.d_models)}: {bad[0]} is not a multiple of 64 (heads of 64)")
