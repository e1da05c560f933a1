"""`mhalab bench overhead`: a real run's training step against a plain PyTorch loop on the same model and batches.

The run is `mhalab.training.fit.train` on a composed recipe (`recipe`, default the kv_sweep job), with every
callback, logger and checkpoint of a real job; validation is moved past the last step so that only steps are timed.
A callback of the bench (`PlainRounds`) alternates, in the same process: `steps_per_round` steps of the run, timed
from its own hook to its next call, then as many steps of the plain loop, then a float32 matmul measuring this
core's peak. The plain loop is what nanoGPT or Zoology would write: `mhalab.model.build_model` on the run's own
architecture with the run's starting weights, AdamW with the same parameter groups, the same warm-up/cosine
schedule and gradient clipping, and batches drawn once from the run's own training loader and then indexed in
memory. Both sides run on the same threads (`torch_threads` of the recipe); the plain loop without
`torch.use_deterministic_algorithms` (a plain loop does not ask for it, so the run's setting counts as its cost). Reported: the median of the per-round ratios run / plain, and each
side's fraction of the matmul peak measured in the same rounds (model FLOPs: `mhalab.cost.train_flops`), and the
median ratio of process CPU time per step, which other work on a loaded machine moves far less than wall time.
With `floor=true` (the default) the same plain rounds then run beside a bare Lightning Trainer
(`Trainer(barebones=True)`, `BareModule`: the same model, loss, optimiser and clipping, nothing else): the Trainer's
own floor, which no run it trains can go under, and run / bare, what mhalab adds to it; and beside a hand loop under
Lightning Fabric (`fabric_rounds`): what Lightning costs without its Trainer's loop; and a second plain loop against
the first (`null_rounds`): the bench's own null.
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import lightning as L
import torch

from mhalab.bench.output import md_table, start, write
from mhalab.bench.timing import loadavg
from mhalab.cost import matmul_flops
from mhalab.bench.config import OverheadConfig

COLUMNS = [("round", "round", "d"), ("run_ms", "run ms/step", ".2f"), ("plain_ms", "plain ms/step", ".2f"),
           ("ratio", "run / plain", ".3f"), ("peak_gflops", "matmul peak GFLOP/s", ".1f"),
           ("run_peak", "run / peak", ".3f"), ("plain_peak", "plain / peak", ".3f"),
           ("cpu_ratio", "run / plain (CPU)", ".3f")]


class PlainRounds(L.Callback):
    """Alternates the run's steps with a plain loop's: after `warmup` steps, every `steps` run steps it times them,
    runs `steps` plain steps, then a matmul for the peak. `PlainRounds.last` is the latest instance (the bench
    reads its rows after the run)."""

    last: "PlainRounds | None" = None

    def __init__(self, steps: int, rounds: int, warmup: int, peak_size: int = 1024, batches: list | None = None):
        self.steps, self.rounds, self.warmup, self.peak_size = steps, rounds, warmup, peak_size
        self.batches = batches  # the plain loop's batches; None: drawn from the run's training loader
        self.rows: list[dict] = []
        self.flops_per_step = 0
        self._t: float | None = None
        self._cpu: float | None = None  # process CPU seconds at self._t: on a loaded machine wall time is others'
        PlainRounds.last = self

    def on_train_start(self, trainer, pl_module) -> None:
        from mhalab.cost import train_flops

        self.plain_step, batch = plain_loop(trainer, pl_module, pool=self.steps, batches=self.batches)
        self.flops_per_step = batch["input_ids"].shape[0] * train_flops(pl_module.arch, batch["input_ids"].shape[1])
        g = torch.Generator().manual_seed(0)
        self._a, self._b = (torch.randn(self.peak_size, self.peak_size, generator=g) for _ in range(2))
        for _ in range(2):
            self.plain_step()  # warm-up of the plain side (allocator, first AdamW step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step < self.warmup or (step - self.warmup) % self.steps or len(self.rows) >= self.rounds:
            return
        now, cpu = time.perf_counter(), time.process_time()
        if self._t is not None:
            run_s, run_cpu = (now - self._t) / self.steps, (cpu - self._cpu) / self.steps
            deterministic = (torch.are_deterministic_algorithms_enabled(),
                             torch.is_deterministic_algorithms_warn_only_enabled())
            torch.use_deterministic_algorithms(False)  # a plain loop does not ask for it; the run's setting is its cost
            peak = self.peak()  # before each side's steps (and again below): both start after the same matmul
            t, c = time.perf_counter(), time.process_time()
            for _ in range(self.steps):
                self.plain_step()
            plain_s, plain_cpu = (time.perf_counter() - t) / self.steps, (time.process_time() - c) / self.steps
            torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
            peak = max(peak, self.peak())
            self.rows.append({"round": len(self.rows) + 1, "run_ms": 1e3 * run_s, "plain_ms": 1e3 * plain_s,
                              "ratio": run_s / plain_s, "peak_gflops": peak / 1e9,
                              "run_peak": self.flops_per_step / run_s / peak,
                              "plain_peak": self.flops_per_step / plain_s / peak, "cpu_ratio": run_cpu / plain_cpu})
            print(f"round {len(self.rows)}/{self.rounds}: run {1e3 * run_s:.2f} ms/step, plain {1e3 * plain_s:.2f}, "
                  f"ratio {run_s / plain_s:.3f} (CPU {run_cpu / plain_cpu:.3f})", flush=True)
        else:
            self.peak()  # the first round's run steps start after the matmul too
        self._t, self._cpu = time.perf_counter(), time.process_time()

    def peak(self, repeats: int = 5) -> float:
        """FLOP/s of the best of `repeats` float32 peak_size^3 matmuls on the threads the run uses."""
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            self._a @ self._b
            best = min(best, time.perf_counter() - t)
        n = self.peak_size
        return matmul_flops(n, n, n) / best


def optimiser(model, o: dict, total: int):
    """(AdamW, LambdaLR) as the run builds them (`AttentionLitModule.configure_optimizers`): decay on matrices only,
    warm-up then cosine over `total` steps."""
    from mhalab.training.module import adamw_kwargs, lr_lambda

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"], **adamw_kwargs(o.get("fused"), decay))
    warmup = min(int(o["warmup_ratio"] * total) if o.get("warmup_ratio") is not None else o["warmup_steps"], total)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_lambda(s, warmup, total, o["min_lr_ratio"]))


def loss_of(model, batch: dict, lm: bool) -> torch.Tensor:
    """The training loss every side of the bench computes: mean cross-entropy over the labelled positions."""
    from mhalab.training.evaluation import mean_cross_entropy

    logits = model(batch["input_ids"]).logits  # (B, T, V) or (B, C)
    y = batch["labels"]  # (B, T) or (B,)
    return mean_cross_entropy(logits.reshape(-1, logits.shape[-1]) if lm else logits, y.reshape(-1) if lm else y)


def pool_batches(datamodule, pool: int) -> list[dict]:
    """The first `pool` batches of the run's training loader (all of them when it has fewer), without its sampler
    state: what the plain loop indexes in memory."""
    batches = []
    for b in datamodule._loader("train", shuffle=False):
        batches.append(b)
        if len(batches) == pool:
            break
    return batches


def plain_loop(trainer, pl_module, pool: int, batches: list[dict] | None = None):
    """(step function, a batch) of a plain loop on a copy of the run's model and optimiser settings, over `batches`
    (default `pool_batches` of the run's data module) indexed in memory, in turn."""
    from mhalab.model import build_model

    model = build_model(pl_module.arch)
    model.load_state_dict(pl_module.model.state_dict())
    model.train()
    opt, sched = optimiser(model, pl_module.hparams.optim, max(1, int(trainer.estimated_stepping_batches)))
    clip = trainer.gradient_clip_val
    batches = batches or pool_batches(trainer.datamodule, pool)
    pool = len(batches)
    ids = torch.stack([b["input_ids"] for b in batches])  # (pool, B, T)
    labels = torch.stack([b["labels"] for b in batches])  # (pool, B, T) or (pool, B)
    lm = pl_module.is_lm
    i = [0]

    def step() -> None:
        k = i[0] % pool
        i[0] += 1
        loss = loss_of(model, {"input_ids": ids[k], "labels": labels[k]}, lm)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        sched.step()

    return step, batches[0]


class BareModule(L.LightningModule):
    """The run's model as Lightning's own examples train it: `training_step` returns the loss, and
    `configure_optimizers` gives AdamW with the run's groups and warm-up/cosine schedule; no metrics, no logging.
    Under `Trainer(barebones=True)` (`bare_rounds`), what it costs beyond the plain loop is Lightning's own loop:
    the floor under any run mhalab trains with Lightning."""

    def __init__(self, arch, optim: dict):
        from mhalab.model import build_model

        super().__init__()
        self.arch = arch
        self.hparams.optim = optim  # what AttentionLitModule.configure_optimizers and `plain_loop` read
        self.model = build_model(arch)
        self.is_lm = arch.objective != "classification"

    def training_step(self, batch, batch_idx):
        return loss_of(self.model, batch, self.is_lm)

    def configure_optimizers(self):
        from mhalab.training.module import AttentionLitModule

        return AttentionLitModule.configure_optimizers(self)


def bare_module(tc, cfg: OverheadConfig, steps: int):
    """(a BareModule of the run's architecture at the run's seed, the plain loop's in-memory batches, and those
    batches in turn for `steps` steps: what the floors are fed, so that no data loader is timed on either side)."""
    from mhalab.data import build_datamodule

    L.seed_everything(tc.seed, workers=True, verbose=False)
    dm = build_datamodule(tc.data, seed=tc.seed)
    dm.prepare_data()
    dm.setup("fit")
    module = BareModule(tc.architecture(dm.vocab_size, dm.objective, dm.n_classes), dataclasses.asdict(tc.optim))
    pool = pool_batches(dm, cfg.steps_per_round)
    return module, pool, Feed([pool[i % len(pool)] for i in range(steps)])


class Feed:
    """Batches in turn, as one iterable (a bare list would be read by Lightning as a list of data loaders)."""

    def __init__(self, batches: list[dict]):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def bare_rounds(tc, cfg: OverheadConfig, steps: int) -> list[dict]:
    """`PlainRounds` rows of `BareModule` on the run's model and starting seed, in a Trainer with `barebones=True`
    (Lightning's mode for measuring its own overhead: no logger, checkpoint, progress bar, model summary or sanity
    check), no validation or determinism, the run's gradient clipping, fed the plain loop's own batches."""
    module, pool, feed = bare_module(tc, cfg, steps)
    rounds = PlainRounds(cfg.steps_per_round, cfg.rounds, cfg.warmup_steps, batches=pool)
    trainer = L.Trainer(accelerator="cpu", devices=1, barebones=True, max_steps=steps, max_epochs=1,
                        gradient_clip_val=tc.trainer.gradient_clip_val, callbacks=[rounds])
    trainer.fit(module, train_dataloaders=feed)
    if len(rounds.rows) < cfg.rounds:
        raise RuntimeError(f"the bare Lightning run stopped after {len(rounds.rows)} of {cfg.rounds} rounds")
    return rounds.rows


def driven_rounds(tc, cfg: OverheadConfig, steps: int, name: str, make_step) -> list[dict]:
    """`PlainRounds` rows of a loop the bench drives by hand, the plain rounds called from it as the Trainer calls
    them from its hooks: `make_step(state, module, pool)` gives the loop's step on one batch, made after the plain
    side has copied the starting weights; the loop is fed the plain loop's own batches."""
    from types import SimpleNamespace

    module, pool, feed = bare_module(tc, cfg, steps)
    rounds = PlainRounds(cfg.steps_per_round, cfg.rounds, cfg.warmup_steps, batches=pool)
    state = SimpleNamespace(estimated_stepping_batches=steps, gradient_clip_val=tc.trainer.gradient_clip_val,
                            global_step=0)  # what the plain rounds read of a trainer
    rounds.on_train_start(state, module)
    step = make_step(state, module, pool)
    for batch in feed:
        step(batch)
        state.global_step += 1
        rounds.on_train_batch_end(state, module, None, batch, state.global_step)
    if len(rounds.rows) < cfg.rounds:
        raise RuntimeError(f"the {name} stopped after {len(rounds.rows)} of {cfg.rounds} rounds")
    return rounds.rows


def fabric_rounds(tc, cfg: OverheadConfig, steps: int) -> list[dict]:
    """`PlainRounds` rows of the same model trained by a hand loop under Lightning Fabric (Lightning without its
    Trainer: `fabric.setup`, `fabric.backward`, `clip_gradients`; the run's optimiser, schedule and clipping)."""
    from lightning.fabric import Fabric

    def make_step(state, module, pool):
        with warnings.catch_warnings():  # a machine with SLURM installed: Fabric's hint to launch with srun
            warnings.filterwarnings("ignore", message=".*srun.*")
            fabric = Fabric(accelerator="cpu", devices=1, precision="32-true")
        opt, sched = optimiser(module.model, module.hparams.optim, steps)
        model, opt = fabric.setup(module.model, opt)
        clip = state.gradient_clip_val

        def step(batch):
            loss = loss_of(model, batch, module.is_lm)
            opt.zero_grad(set_to_none=True)
            fabric.backward(loss)
            if clip:
                fabric.clip_gradients(model, opt, max_norm=clip)
            opt.step()
            sched.step()
        return step

    return driven_rounds(tc, cfg, steps, "Fabric loop", make_step)


def null_rounds(tc, cfg: OverheadConfig, steps: int) -> list[dict]:
    """`PlainRounds` rows of a second plain loop against the first (same model, weights and batches): the bench's
    own null, what its rounds give when both sides run the same code (its bias and spread)."""
    def make_step(state, module, pool):
        other, _ = plain_loop(state, module, cfg.steps_per_round, batches=pool)
        return lambda batch: other()

    return driven_rounds(tc, cfg, steps, "null loop", make_step)


def run_overhead(cfg: OverheadConfig) -> dict:
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from mhalab.runs.preflight import check_job, compose
    from mhalab.training.fit import train

    out, info = start(cfg, "overhead", torch.device("cpu"))
    steps = cfg.warmup_steps + cfg.steps_per_round * (cfg.rounds + 1)
    with tempfile.TemporaryDirectory(prefix="mhalab-bench-overhead-") as root:
        run_dir = Path(root) / "run"
        overrides = [*cfg.recipe, f"trainer.max_steps={steps}", f"trainer.val_check_interval={steps + 1}",
                     "trainer.check_val_every_n_epoch=null", "trainer.max_epochs=null", "test=false",
                     f"hydra.run.dir={run_dir}", f"paths.log_dir={root}/logs",
                     *([f"data.cache_dir={cfg.cache_dir}"] if cfg.cache_dir else [])]
        composed = compose(overrides)
        tc = check_job(composed, run_dir, cli=overrides)  # every check a job gets, as `mhalab train` does
        HydraConfig.instance().set_config(composed)  # the loggers' ${hydra:runtime.output_dir}, as in a job
        with open_dict(tc.callbacks):
            tc.callbacks["bench_plain_rounds"] = {"_target_": "mhalab.bench.overhead.PlainRounds",
                                                  "steps": cfg.steps_per_round, "rounds": cfg.rounds,
                                                  "warmup": cfg.warmup_steps}
        train(tc, run_dir, overrides)
        rounds = PlainRounds.last
        rows = rounds.rows
        if len(rows) < cfg.rounds:
            raise RuntimeError(f"the run stopped after {len(rows)} of {cfg.rounds} rounds")
        floor = bare_rounds(tc, cfg, steps) if cfg.floor else []
        fabric = fabric_rounds(tc, cfg, steps) if cfg.floor else []
        null = null_rounds(tc, cfg, steps) if cfg.floor else []
    med = {k: statistics.median(r[k] for r in rows)
           for k in ("ratio", "run_peak", "plain_peak", "peak_gflops", "cpu_ratio")}
    for name, rs in (("floor", floor), ("fabric", fabric), ("null", null)):
        if rs:
            med[f"{name}_ratio"] = statistics.median(r["ratio"] for r in rs)
            med[f"{name}_cpu_ratio"] = statistics.median(r["cpu_ratio"] for r in rs)
    info["loadavg_end"] = loadavg()
    info["torch_threads"] = torch.get_num_threads()
    info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    result = {"machine": info, "config": {"recipe": cfg.recipe, "rounds": cfg.rounds, "goal": cfg.goal,
                                          "steps_per_round": cfg.steps_per_round, "warmup_steps": cfg.warmup_steps},
              "flops_per_step": rounds.flops_per_step, "rows": rows, "floor_rows": floor, "fabric_rows": fabric,
              "null_rows": null, **med,
              "within_goal": med["ratio"] <= cfg.goal}
    verdict = "within" if med["ratio"] <= cfg.goal else "OVER"
    report = (f"# mhalab bench overhead: a run's training step against a plain PyTorch loop\n\n"
              f"machine: {info['cpu']} ({info['cpu_capability']} kernels), {info['cpu_count']} CPUs, "
              f"torch {info['torch']} on {info['torch_threads']} thread(s); load average {info.get('loadavg_start')} "
              f"at start, {info['loadavg_end']} at end\n\n"
              f"run: `mhalab train {' '.join(cfg.recipe)}` (validation past the last step); plain loop: the same "
              f"model, weights, optimiser groups, schedule, clipping and batches; {cfg.rounds} rounds of "
              f"{cfg.steps_per_round} steps each side after {cfg.warmup_steps} warm-up steps\n\n"
              f"{md_table(rows, COLUMNS)}\n\n"
              f"**median run / plain: {med['ratio']:.3f}** ({verdict} the goal of {cfg.goal:g}); fraction of the "
              f"float32 matmul peak ({med['peak_gflops']:.1f} GFLOP/s, measured each round): run "
              f"**{med['run_peak']:.3f}**, plain **{med['plain_peak']:.3f}**; median run / plain in process CPU time "
              f"(what other work on a loaded machine moves least): {med['cpu_ratio']:.3f}\n"
              + (f"\n**Lightning's floor**: the same model, plain loop and rounds under a bare Trainer (`BareModule`: "
                 f"training_step returns the loss; `Trainer(barebones=True)`, no validation or determinism; the "
                 f"run's clipping; fed the plain loop's own in-memory batches, so no data loader is timed): bare Lightning / plain **{med['floor_ratio']:.3f}** (CPU "
                 f"{med['floor_cpu_ratio']:.3f}); what mhalab adds on top: run / bare "
                 f"{med['ratio'] / med['floor_ratio']:.3f} (its rounds below, where 'run' is the bare Trainer)\n\n"
                 f"{md_table(floor, COLUMNS)}\n" if floor else "")
              + (f"\n**Lightning without its Trainer**: the same model, plain loop and rounds, trained by a hand loop "
                 f"under Lightning Fabric (`fabric_rounds`): Fabric / plain **{med['fabric_ratio']:.3f}** (CPU "
                 f"{med['fabric_cpu_ratio']:.3f}) (its rounds below, where 'run' is the Fabric loop)\n\n"
                 f"{md_table(fabric, COLUMNS)}\n" if fabric else "")
              + (f"\n**The bench's null**: a second plain loop against the first, the same code on both sides: "
                 f"plain / plain **{med['null_ratio']:.3f}** (rounds {min(r['ratio'] for r in null):.3f}-"
                 f"{max(r['ratio'] for r in null):.3f}): a ratio within this of 1 is not the bench's to tell apart\n"
                 if null else ""))
    write(out, result, report, [("overhead", rows)] + ([("floor", floor)] if floor else [])
          + ([("fabric", fabric)] if fabric else []) + ([("null", null)] if null else []))
    print(report)
    return result
