"""The config schema: every key of a training run, its type, default and checks, in one place.

The dataclasses below are registered with Hydra as the structured config `train_schema` (`register()`), which
`conf/train.yaml` puts first in its defaults list: Hydra then refuses unknown keys and values of the wrong type
while composing, the YAML files hold only values that differ from these defaults, and `OmegaConf.to_object`
builds these classes, whose `__post_init__` checks ranges and combinations. The same classes are what the code
reads; the model's part (`ModelConfig`, `AttentionConfig`, the resolved `Architecture`) is `mhalab.architecture`.

Every error is a `ConfigError`: one sentence naming the key and the allowed values. This module imports no torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from mhalab.architecture import Architecture, AttentionConfig, ModelConfig
from mhalab.checks import INT64_MAX, check_choice, check_int, check_name, check_number
from mhalab.data.config import DataConfig
from mhalab.errors import ConfigError
from mhalab.heads import resolve_heads

ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps")
STRATEGIES = ("auto", "ddp", "ddp_spawn", "ddp_find_unused_parameters_true", "single_device")
PRECISIONS = ("32-true", "32", "16-mixed", "bf16-mixed", "bf16-true", "16-true", "64-true", "64")
PROFILERS = ("simple", "advanced", "pytorch")
OPTIMIZED_METRICS = ("val/loss", "val/acc", "val/acc_best", "val/bpb", "train/loss")  # a run's final metrics
ENDPOINT_METRICS = ("val/loss", "val/acc", "val/bpb")  # recorded at every validation (the run's history)
BPB = "val/bpb"  # logged by text language models only (`mhalab.data.config.DataConfig.reports_bpb`)
MAX_TAG = 64  # characters in a tag (wandb refuses longer ones when the run starts)
MAX_SEED = 2**32 - 1


# -- training --------------------------------------------------------------------------------------------------

def clips_under_amp(precision: str, gradient_clip_val: float | None) -> bool:
    """Whether Lightning clips gradients under its mixed-precision plugin: it then refuses a fused AdamW (which
    unscales gradients inside its step) with a RuntimeError at the first step, seen on an H100 (experiments/gpu)."""
    return str(precision).endswith("-mixed") and gradient_clip_val is not None and gradient_clip_val > 0


@dataclass
class OptimConfig:
    """AdamW with linear warm-up, then cosine decay to min_lr_ratio * lr, stepped every optimizer step."""

    lr: float = 2.0e-3
    weight_decay: float = 0.01  # on matrices and embeddings only (not biases or norms), as in nanoGPT
    betas: List[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1.0e-8
    warmup_steps: int = 30
    warmup_ratio: Optional[float] = None  # a fraction of all training steps; replaces warmup_steps when set
    min_lr_ratio: float = 0.1
    fused: Optional[bool] = None  # torch's fused AdamW kernel: None = fused when every parameter is on a CUDA device
    #   and gradients are not clipped under mixed precision (clips_under_amp), else torch's default (foreach);
    #   true = fused wherever torch has it (CUDA, and the CPU since torch 2.4); false = never
    #   (mhalab.training.module.adamw_kwargs)

    def __post_init__(self):
        if self.fused is not None and not isinstance(self.fused, bool):
            raise ConfigError(f"optim.fused={self.fused!r}: fused must be true, false or null (auto: fused on CUDA)")
        check_number("optim.lr", self.lr, 0, 10, low_open=True)
        check_number("optim.weight_decay", self.weight_decay, 0)
        if len(self.betas) != 2:
            raise ConfigError(f"optim.betas={list(self.betas)!r}: betas must be two numbers in [0, 1)")
        for i, beta in enumerate(self.betas):
            check_number(f"optim.betas[{i}]", beta, 0, 1, high_open=True)
        check_number("optim.eps", self.eps, 0, low_open=True)
        check_int("optim.warmup_steps", self.warmup_steps, 0)
        if self.warmup_ratio is not None:
            check_number("optim.warmup_ratio", self.warmup_ratio, 0, 1, high_open=True)
        check_number("optim.min_lr_ratio", self.min_lr_ratio, 0, 1)


@dataclass
class StatsConfig:
    """Per-head attention statistics on a fixed probe batch (`mhalab.training.callbacks.HeadStatsCallback`)."""

    enabled: bool = True
    every_n_steps: int = 50  # one extra no-grad pass every n optimizer steps, and one at each validation end
    probe_size: int = 8  # validation examples in the probe batch
    importance: bool = True  # head importance (Michel et al. 2019) at the end of training
    importance_batches: int = 8  # validation batches whose examples importance averages over
    plots: bool = True  # attention maps and layer x head heatmaps in <run_dir>/plots
    max_plot_tokens: int = 32  # tokens shown in the attention maps, each labelled
    picture_passes: int = 5  # statistics passes whose pictures go to TensorBoard/wandb while training (0 = none)
    detector_len: int = 16  # head detectors on random tokens repeated once: 2 x this many (0 = off)
    extra: Dict[str, Any] = field(default_factory=dict)  # name -> {_target_: your statistic class, ...}

    def __post_init__(self):
        check_int("stats.every_n_steps", self.every_n_steps, 1)
        check_int("stats.probe_size", self.probe_size, 1, 4096)
        check_int("stats.importance_batches", self.importance_batches, 1)
        check_int("stats.max_plot_tokens", self.max_plot_tokens, 2, 512)
        check_int("stats.picture_passes", self.picture_passes, 0, 1000)
        check_int("stats.detector_len", self.detector_len, 0, 2048)
        for name, stat in (self.extra or {}).items():  # clashes with built-in names: HeadStatsCallback
            if not (isinstance(name, str) and name.isidentifier()):
                raise ConfigError(f"stats.extra.{name}: name your statistic with letters, digits and '_'")
            if not (callable(stat) or isinstance(stat, dict) and "_target_" in stat):
                raise ConfigError(f"stats.extra.{name}={stat!r}: give {{_target_: your_package.YourStatistic}}")


@dataclass
class TrainerConfig:
    """The arguments of `lightning.pytorch.Trainer` that mhalab passes on (others are refused)."""

    accelerator: str = "auto"  # auto picks a GPU when there is one
    devices: Any = 1  # a count, -1 / "auto" (all), or a list of device indices
    strategy: str = "auto"
    num_nodes: int = 1
    precision: str = "32-true"
    min_epochs: Optional[int] = 1
    max_epochs: Optional[int] = 6  # -1 = no limit
    max_steps: int = -1  # -1 = no limit
    gradient_clip_val: Optional[float] = 1.0
    accumulate_grad_batches: int = 1
    log_every_n_steps: int = 10
    check_val_every_n_epoch: Optional[int] = 1
    val_check_interval: Any = 1.0  # a fraction of an epoch in (0, 1], or a number of training batches
    limit_train_batches: Any = None  # None = all, a fraction in (0, 1], or a number of batches
    limit_val_batches: Any = None
    limit_test_batches: Any = None
    overfit_batches: Any = 0.0
    deterministic: Any = True  # true | false | warn: torch.use_deterministic_algorithms
    enable_progress_bar: bool = True
    enable_model_summary: bool = False  # mhalab prints its own summary: parameters and FLOPs per token
    num_sanity_val_steps: int = 2
    profiler: Optional[str] = None  # simple | advanced | pytorch; the report is saved in the run directory
    sync_batchnorm: bool = False
    detect_anomaly: bool = False

    def __post_init__(self):
        t = "trainer."
        check_choice(t + "accelerator", self.accelerator, ACCELERATORS)
        check_choice(t + "strategy", self.strategy, STRATEGIES)
        check_choice(t + "precision", str(self.precision), PRECISIONS)
        self.precision = str(self.precision)
        _check_devices(self.devices)
        check_int(t + "num_nodes", self.num_nodes, 1)
        if self.min_epochs is not None:
            check_int(t + "min_epochs", self.min_epochs, 0)
        if self.max_epochs is not None and self.max_epochs != -1:
            check_int(t + "max_epochs", self.max_epochs, 1)
        if self.max_steps != -1:
            check_int(t + "max_steps", self.max_steps, 1)
        if self.max_steps == -1 and self.max_epochs in (None, -1):
            raise ConfigError("trainer.max_epochs=-1 with trainer.max_steps=-1: training would never end; "
                              "set max_epochs >= 1 or max_steps >= 1")
        if self.gradient_clip_val is not None:
            check_number(t + "gradient_clip_val", self.gradient_clip_val, 0)
        check_int(t + "accumulate_grad_batches", self.accumulate_grad_batches, 1)
        check_int(t + "log_every_n_steps", self.log_every_n_steps, 1)
        if self.check_val_every_n_epoch is not None:
            check_int(t + "check_val_every_n_epoch", self.check_val_every_n_epoch, 1)
        _check_fraction_or_count(t + "val_check_interval", self.val_check_interval, allow_zero=False)
        for key in ("limit_train_batches", "limit_val_batches", "limit_test_batches"):
            if getattr(self, key) is not None:
                _check_fraction_or_count(t + key, getattr(self, key), allow_zero=False)
        _check_fraction_or_count(t + "overfit_batches", self.overfit_batches, allow_zero=True)
        if self.deterministic not in (True, False, "warn"):
            raise ConfigError(f"trainer.deterministic={self.deterministic!r}: deterministic must be true, false or warn")
        check_int(t + "num_sanity_val_steps", self.num_sanity_val_steps, -1)
        if self.profiler is not None:
            check_choice(t + "profiler", self.profiler, PROFILERS)

    @property
    def wants_gpu(self) -> bool:
        return self.accelerator in ("gpu", "cuda")


    def batches(self, split: str, n: int) -> int:
        """The batches of `split` ("train", "val", "test") an epoch runs out of the `n` its data gives, as
        Lightning counts them (limit_*_batches: a count caps, a fraction scales)."""
        limit = getattr(self, f"limit_{split}_batches")
        if limit is None or limit == 1.0 and isinstance(limit, float):
            return n
        return min(n, limit) if isinstance(limit, int) else int(n * limit)

    def check_sizes(self, n: dict[str, int]) -> list[str]:
        """The settings that depend on the data's size, against the batches each split gives (`n`: {"train": ..,
        "val": .., "test": ..}): a ConfigError for what Lightning would refuse with a traceback, and the warnings
        for what would silently leave no number (returned, one sentence each)."""
        t = "trainer."
        for split, name in (("train", "training"), ("val", "validation"), ("test", "test")):
            limit = getattr(self, f"limit_{split}_batches")
            if split in n and n[split] and self.batches(split, n[split]) == 0:
                raise ConfigError(f"{t}limit_{split}_batches={limit} gives 0 of the {n[split]} {name} batches; give "
                                  f"a fraction >= {1 / n[split]:.3g} or a count of batches >= 1")
        if self.overfit_batches:  # Lightning then trains and validates on those batches
            return []
        train = self.batches("train", n["train"])
        limited = f" (with {t}limit_train_batches={self.limit_train_batches})" if self.limit_train_batches else ""
        if isinstance(self.val_check_interval, int) and self.check_val_every_n_epoch is not None and \
                self.val_check_interval > train:
            raise ConfigError(f"{t}val_check_interval={self.val_check_interval} is more than the {train} training "
                              f"batches of an epoch{limited}; give a count <= {train}, a fraction of an epoch in "
                              f"(0, 1], or {t}check_val_every_n_epoch=null to count batches across epochs")
        steps_per_epoch = max(1, train // self.accumulate_grad_batches)
        epochs = self.max_epochs if self.max_epochs not in (None, -1) else float("inf")
        steps = min(self.max_steps if self.max_steps != -1 else float("inf"), epochs * steps_per_epoch)
        warnings = []
        if self.log_every_n_steps > steps:
            warnings.append(f"{t}log_every_n_steps={self.log_every_n_steps} is more than the run's {steps:.0f} "
                            "optimizer steps: the loggers get no training metrics (summary.json has them)")
        every = self.check_val_every_n_epoch
        if every is not None and self.max_steps != -1 and steps < every * steps_per_epoch and \
                (self.val_check_interval == 1.0 or every > 1):
            warnings.append(f"{t}check_val_every_n_epoch={every} with {t}max_steps={self.max_steps}: training ends "
                            f"before its first validation ({every} epochs of {steps_per_epoch} steps); only the "
                            "closing validation runs and no best checkpoint is chosen")
        return warnings


def _check_devices(devices: Any) -> None:
    ok = (devices == "auto" or devices == -1 or (isinstance(devices, int) and not isinstance(devices, bool)
                                                   and 1 <= devices <= INT64_MAX)
          or (isinstance(devices, (list, tuple)) and devices and all(isinstance(d, int) and d >= 0 for d in devices)))
    if not ok:
        raise ConfigError(f"trainer.devices={devices!r}: devices must be a count in [1, 2**63 - 1], -1 or auto (all), "
                          "or a list of device indices such as [0, 1]")


def _check_fraction_or_count(key: str, value: Any, allow_zero: bool) -> None:
    """A fraction in (0, 1] (a float) or a count >= 1 (an int); 0 / 0.0 only where allow_zero."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{key}={value!r}: {key} must be a fraction in (0, 1] or a count of batches in "
                          "[1, 2**63 - 1]")
    if allow_zero and value == 0:
        return
    if isinstance(value, float) and not 0 < value <= 1 or isinstance(value, int) and not 1 <= value <= INT64_MAX:
        raise ConfigError(f"{key}={value!r}: {key} must be a fraction in (0, 1] or a count of batches in "
                          "[1, 2**63 - 1]")


@dataclass
class CheckpointConfig:
    """What is saved: `last.ckpt` at every checkpoint event and at the end; the best by `monitor` for test."""

    every_n_steps: Optional[int] = None  # also save last.ckpt every n optimizer steps (bounds the work lost)
    monitor: str = "val/loss"  # a metric logged at every validation (OPTIMIZED_METRICS)
    mode: str = "min"  # min | max: the monitored metric's own direction (min for losses and bpb, max for accuracies)

    def __post_init__(self):
        from mhalab.stats import lower_is_better

        if self.every_n_steps is not None:
            check_int("checkpoint.every_n_steps", self.every_n_steps, 1)
        check_choice("checkpoint.monitor", self.monitor, OPTIMIZED_METRICS)
        check_choice("checkpoint.mode", self.mode, ("min", "max"))
        better = "min" if lower_is_better(self.monitor) else "max"
        if self.mode != better:
            raise ConfigError(f"checkpoint.mode={self.mode} with checkpoint.monitor={self.monitor}: {self.monitor} is "
                              f"better when it is {'lower' if better == 'min' else 'higher'}, so mode must be {better} "
                              "(else the worst checkpoint is kept as the best)")


@dataclass
class PathsConfig:
    """Where a run's files go; the root is MHALAB_ROOT if set, else the current directory."""

    root_dir: str = "${oc.env:MHALAB_ROOT,${mhalab.cwd:}}"
    log_dir: str = "${paths.root_dir}/logs"
    cache_dir: str = "${paths.root_dir}/.cache/mhalab"  # tokenized datasets, trained tokenizers


@dataclass
class EndpointConfig:
    """What an experiment measures and how `mhalab report` compares its arms (docs/definitions.md, "Endpoints").

    Recorded with every run, so the report reads the design from the runs themselves."""

    metric: str = "val/acc"  # the validation metric the endpoints are about
    threshold: Optional[float] = None  # a run "reaches" the task at the first validation with metric >= threshold
    stop_at_threshold: bool = False  # end the run at that validation (saves the compute of runs that got there)
    tuned: List[str] = field(default_factory=list)  # override keys tuned per arm (e.g. optim.lr): each arm is
    #   reported at its best value on validation
    margin: Optional[float] = None  # equivalence margin (TOST, +-margin on the metric), declared before the runs
    selection_seeds: List[int] = field(default_factory=list)  # stage A: the seeds that choose each arm's tuned value;
    #   the report tests the chosen values on the other seeds only (stage B). Empty: the same seeds do both

    def __post_init__(self):
        if self.metric not in ENDPOINT_METRICS:
            raise ConfigError(f"endpoint.metric={self.metric!r}: the endpoint metric must be a validation metric "
                              f"recorded at every validation ({', '.join(ENDPOINT_METRICS)})")
        if self.threshold is not None:
            check_number("endpoint.threshold", self.threshold, -1e12, 1e12)
        if self.stop_at_threshold and self.threshold is None:
            raise ConfigError("endpoint.stop_at_threshold=true needs endpoint.threshold (the value to stop at)")
        if self.margin is not None:
            check_number("endpoint.margin", self.margin, 0, 1e12, low_open=True)
        for key in self.tuned:
            if not isinstance(key, str) or not key or "=" in key:
                raise ConfigError(f"endpoint.tuned entry {key!r}: give an override key such as optim.lr")
        for seed in self.selection_seeds:
            if not isinstance(seed, int) or isinstance(seed, bool):
                raise ConfigError(f"endpoint.selection_seeds entry {seed!r}: give integer seeds (the stage-A seeds "
                                  "that choose each arm's tuned value)")


# the second numerics a verdict is re-run under (scripts/run_design.py):
NUMERICS = ("avx2", "scalar", "threads2", "bf16")
#   torch's AVX2 kernels (ATEN_CPU_CAPABILITY=avx2; where those are the CPU's default, the runner runs scalar instead),
#   ATen's unvectorised kernels (ATEN_CPU_CAPABILITY=default), 2 torch threads instead of 1, or bf16 mixed precision


@dataclass
class DesignConfig:
    """An experiment's declared plan beyond stage A (`scripts/run_design.py` runs it; recorded with every run).

    Stage A is the sweep itself (its grid on endpoint.selection_seeds); then each arm's chosen value is run on the
    fresh stage-B seeds, and again on each second numerics' own fresh seeds."""

    stage_b_seeds: List[int] = field(default_factory=list)  # fresh seeds at each arm's chosen value
    numerics_seeds: Dict[str, List[int]] = field(default_factory=dict)  # avx2 | threads2 | bf16 -> its own fresh seeds
    strata: List[str] = field(default_factory=list)  # overrides run as separate sweeps, each reported on its own
    #   (e.g. "data.mqar.n_kv_pairs=8 data.mqar.seq_len=64"); empty: one sweep
    baseline: Optional[str] = None  # the arm each report compares with (mhalab report --baseline)

    def __post_init__(self):
        for name in self.numerics_seeds:
            check_choice("design.numerics_seeds", name, NUMERICS)
        for key, seeds in [("design.stage_b_seeds", self.stage_b_seeds)] + \
                [(f"design.numerics_seeds.{n}", s) for n, s in self.numerics_seeds.items()]:
            for seed in seeds:
                if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
                    raise ConfigError(f"{key} entry {seed!r}: give non-negative integer seeds")
        for stratum in self.strata:
            if not isinstance(stratum, str) or not stratum.split() or \
                    not all("=" in o and not o.startswith("=") for o in stratum.split()):
                raise ConfigError(f"design.strata entry {stratum!r}: give space-separated overrides key=value")

    def check_fresh(self, selection_seeds: List[int]) -> None:
        """Every stage's seeds are its own: no seed of stage A, stage B or one numerics is used by another."""
        stages = [("endpoint.selection_seeds", selection_seeds), ("design.stage_b_seeds", self.stage_b_seeds)] + \
            [(f"design.numerics_seeds.{n}", s) for n, s in self.numerics_seeds.items()]
        for i, (k1, s1) in enumerate(stages):
            for k2, s2 in stages[i + 1:]:
                if set(s1) & set(s2):
                    raise ConfigError(f"{k2} shares seeds {sorted(set(s1) & set(s2))} with {k1}: each stage needs "
                                      "fresh seeds")


@dataclass
class TrainConfig:
    """A whole training run: `mhalab train` composes it from `conf/train.yaml` and its groups."""

    task_name: str = "train"  # names the log folder: logs/<task_name>/...
    tags: List[str] = field(default_factory=lambda: ["dev"])
    seed: int = 42
    train: bool = True
    test: bool = True  # evaluate the best checkpoint on the test split after training
    ckpt_path: Optional[str] = None  # start from this checkpoint's weights, optimizer and step in a new run
    resume: Any = False  # true: continue the newest unfinished run with these overrides; or a run directory
    torch_threads: Optional[int] = None  # torch intra-op threads (None: the CPUs the job was given: SLURM's
    #   allocation or the affinity mask, divided among a local launcher's n_jobs; mhalab.training.fit.job_threads)
    data: DataConfig = field(default_factory=lambda: DataConfig(cache_dir="${paths.cache_dir}"))
    model: ModelConfig = field(default_factory=ModelConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    stats: StatsConfig = field(default_factory=StatsConfig)
    logger: Dict[str, Any] = field(default_factory=dict)  # name -> {_target_: a Lightning logger, ...}
    callbacks: Dict[str, Any] = field(default_factory=dict)  # name -> {_target_: a Lightning callback, ...}
    paths: PathsConfig = field(default_factory=PathsConfig)
    endpoint: EndpointConfig = field(default_factory=EndpointConfig)
    design: DesignConfig = field(default_factory=DesignConfig)
    optimized_metric: str = "val/loss"  # the final metric a run returns to Hydra's sweeper (Optuna's objective);
    #   its direction follows the metric (mhalab.stats.lower_is_better): losses and bpb are minimised,
    #   accuracies maximised (hydra/sweeper=search sets direction from it)

    def __post_init__(self):
        check_int("seed", self.seed, 0, MAX_SEED)
        check_choice("optimized_metric", self.optimized_metric, OPTIMIZED_METRICS)
        if self.optim.fused and clips_under_amp(self.trainer.precision, self.trainer.gradient_clip_val):
            raise ConfigError(f"optim.fused=true with trainer.precision={self.trainer.precision} and "
                              f"trainer.gradient_clip_val={self.trainer.gradient_clip_val}: Lightning cannot clip a "
                              "fused AdamW's gradients under mixed precision; set optim.fused=null (auto) or false, "
                              "or trainer.gradient_clip_val=null")
        if self.torch_threads is not None:
            check_int("torch_threads", self.torch_threads, 1, 4096)
        if not isinstance(self.resume, (bool, str)):
            raise ConfigError(f"resume={self.resume!r}: resume must be true, false or a run directory")
        self.design.check_fresh(self.endpoint.selection_seeds)
        resolve_heads(self.model.d_model, self.attention.n_heads, self.attention.n_kv_heads, self.attention.d_head,
                      "attention.")
        if self.data.max_len > self.model.max_len:
            raise ConfigError(f"data.max_len={self.data.max_len} is longer than the positional table model.max_len="
                              f"{self.model.max_len}: raise model.max_len or lower data.max_len")
        if not self.task_name or not all(c.isalnum() or c in "._-" for c in self.task_name) or \
                self.task_name.strip(".") == "":
            raise ConfigError(f"task_name={self.task_name!r}: task_name names a folder under paths.log_dir; use "
                              "letters, digits, '.', '_' and '-' only")
        check_name("task_name", self.task_name)
        for i, tag in enumerate(self.tags):
            if not isinstance(tag, str) or not 1 <= len(tag) <= MAX_TAG:
                raise ConfigError(f"tags[{i}]={tag!r}: each tag must be a string of 1 to {MAX_TAG} characters "
                                  "(wandb's limit)")

    def check_metrics(self) -> None:
        """The metrics this config names are ones its task logs: val/bpb only for text language models (the data
        resolved)."""
        if self.data.reports_bpb:
            return
        named = (("optimized_metric", self.optimized_metric), ("checkpoint.monitor", self.checkpoint.monitor),
                 ("endpoint.metric", self.endpoint.metric))
        for key, metric in named:
            if metric == BPB:
                raise ConfigError(f"{key}={BPB}: task {self.data.task} ({self.data.objective}) reports no bits per "
                                  f"byte (only text language models do); use one of "
                                  f"{', '.join(m for m in OPTIMIZED_METRICS if m != BPB)}")

    def architecture(self, vocab_size: int, objective: str, n_classes: int | None) -> Architecture:
        """The resolved architecture of this run for the data's vocabulary and classes."""
        return Architecture(vocab_size=vocab_size, objective=objective, n_classes=n_classes,
                            model=dataclasses.replace(self.model), attention=dataclasses.replace(self.attention))


def register() -> None:
    """Store `TrainConfig` as Hydra's structured config `train_schema` (idempotent: stored once a process, as
    converting the dataclasses takes ~10 ms each time)."""
    from hydra.core.config_store import ConfigStore

    if "train_schema.yaml" not in ConfigStore.instance().repo:
        ConfigStore.instance().store(name="train_schema", node=TrainConfig)
