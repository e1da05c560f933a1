"""What a training command prints: `mhalab train --help`, the header of a run, a warning about repeated data, and
the final line (stdout and train.log, through the `mhalab` logger)."""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import sys
import threading
import time
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


def duration(seconds: float) -> str:
    """12m05s, 1h19m, or ? for an unknown time."""
    if not math.isfinite(seconds):
        return "?"
    m, s = divmod(int(round(seconds)), 60)
    return f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m}m{s:02d}s"


class StepEta:
    """The time left in training from the recent steps: the mean time of the last `window` steps (time spent in
    validation left out), scaled by the share of the run's time validation took so far. A slow step, a validation
    or a burst of load moves it by a fraction, not by a factor."""

    def __init__(self, window: int = 100):
        self.steps: collections.deque = collections.deque(maxlen=window)  # seconds per optimizer step
        self.train_s = self.val_s = 0.0
        self._last: float | None = None

    def step(self, now: float, n: int = 1) -> None:
        """`n` optimizer steps ended at `now` (perf_counter)."""
        if self._last is not None and n > 0:
            dt = (now - self._last) / n
            self.steps.extend([dt] * n)
            self.train_s += dt * n
        self._last = now

    def paused(self, seconds: float) -> None:
        """`seconds` went to validation (not to steps) since the last step."""
        self.val_s += seconds
        if self._last is not None:
            self._last += seconds

    def eta(self, steps_left: float) -> float:
        if not self.steps or not math.isfinite(steps_left):
            return float("nan")
        per_step = sum(self.steps) / len(self.steps)
        return steps_left * per_step * (1 + self.val_s / max(self.train_s, 1e-9))


class Heartbeat:
    """A line at least every `interval` seconds while a phase runs (training, validation, test, each end-of-run
    extra), from a background thread: what runs, how far it is, and its own ETA. A phase begins with a line;
    `printed()` says another line was just shown (the ProgressLog's), which resets the clock. A phase with a `key`
    (training: the step) says its line once per key, whether the heartbeat or the regular progress line comes first
    (`once`); a heartbeat at a key already said says how long that step has run instead."""

    def __init__(self, interval: float = 30.0):
        self.interval = interval
        self.phases: list[dict] = []  # a stack: validation inside training
        self._last = time.monotonic()
        self._lock = threading.Lock()
        self._say_lock = threading.Lock()  # the check and the line of `once`, across the two threads
        self._said, self._said_at = None, time.monotonic()  # the last key said, and when
        self._thread: threading.Thread | None = None

    def printed(self) -> None:
        self._last = time.monotonic()

    @contextlib.contextmanager
    def phase(self, what: str, total: int | None = None, line=None, quiet: bool = False, key=None):
        """Run the body as the phase `what` (`total` batches; `line()`: its own progress text; `key()`: what its line
        is about, said once: the training step)."""
        p = {"what": what, "total": total, "done": 0, "t0": time.perf_counter(), "line": line, "key": key}
        with self._lock:
            self.phases.append(p)
            if key is not None:
                self._said = None  # a new training (the next job of a sweep in this process) says its steps anew
        if not quiet:
            self.say(f"{what}: started" + (f" ({total} batches)" if total else ""))
        self._start()
        try:
            yield p
        finally:
            with self._lock:
                self.phases.remove(p)

    def tick(self, done: int | None = None) -> None:
        """The current phase finished one more batch (or `done` in all)."""
        if self.phases:
            p = self.phases[-1]
            p["done"] = p["done"] + 1 if done is None else done

    def ticking(self, items):
        """Yield the items, ticking the current phase after each."""
        for item in items:
            yield item
            self.tick()

    def say(self, text: str) -> None:
        log.info(text)
        self.printed()

    def once(self, key, line) -> bool:
        """Say `line()` unless the line for `key` was said already (one line per training step at most, from the
        heartbeat or the regular progress line, whichever comes first); whether it was said now."""
        with self._say_lock:
            if key == self._said:
                return False
            self._said, self._said_at = key, time.monotonic()
            self.say(line())
            return True

    def describe(self, p: dict) -> str:
        if p["line"] is not None:
            return p["line"]()
        elapsed = time.perf_counter() - p["t0"]
        done, total = p["done"], p["total"]
        eta = elapsed / done * (total - done) if done and total else float("nan")
        part = f"batch {done}/{total} | " if total else ""
        return f"{p['what']}: {part}{elapsed:.0f} s so far | ETA {duration(eta)}"

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="mhalab-heartbeat", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(min(self.interval, 1.0) / 2)
            with self._lock:
                p = self.phases[-1] if self.phases else None
            if p is not None and time.monotonic() - self._last >= self.interval:
                try:
                    if p["key"] is None:
                        self.say(self.describe(p))
                    elif not self.once(key := p["key"](), lambda: self.describe(p)):  # a step that takes long
                        self.say(f"{p['what']}: the step after step {key} has run "
                                 f"{time.monotonic() - self._said_at:.0f} s")
                except Exception:  # noqa: BLE001 - a progress line never stops a run
                    self.printed()


HEARTBEAT = Heartbeat()


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


def unfinished_twin(plan, argv: list[str]) -> str | None:
    """A new single run whose config an unfinished run (interrupted, failed or killed; not running now) already
    has: the line that names it and the command that continues it, else None."""
    import shlex

    from mhalab.runs.identity import run_identity, run_status
    from mhalab.runs.rundir import check_unlocked

    if plan.multirun or plan.show_only or plan.resume_dir is not None or len(plan.jobs) != 1:
        return None
    tc = plan.jobs[0][1]
    if tc.resume or getattr(tc, "identity", None) is None:
        return None
    runs_dir = Path(tc.paths.log_dir) / tc.task_name / "runs"
    twins = []
    for d in sorted(runs_dir.iterdir() if runs_dir.is_dir() else [], reverse=True):  # the latest first
        if d.is_dir() and run_status(d) != "ok" and run_identity(d) == tc.identity:
            try:
                check_unlocked(d)
            except ConfigError:  # another process runs it now
                continue
            twins.append(d)
    if not twins:
        return None
    status = run_status(twins[0]) or "stopped without a summary"
    resume = shlex.join(["mhalab", "train", *(a for a in argv if not a.startswith("resume=")), f"resume={twins[0]}"])
    return (f"mhalab: an unfinished run of this config exists ({status}): {twins[0]}; this command starts a new "
            f"run; to continue that one instead, stop this one and run:\n  {resume}")


def header(dm, arch, cost: dict, run_dir: Path) -> str:
    """The console's short description of a run."""
    m, a = arch.model, arch.attention
    kind = "MHA" if a.n_kv_heads == a.n_heads else "MQA" if a.n_kv_heads == 1 else f"GQA-{a.n_kv_heads}"
    classes = f", {arch.n_classes} classes" if arch.n_classes else ""
    return (f"mhalab: task {dm.task} ({arch.objective}{classes}) | {m.n_layers} layers, d_model {m.d_model}, "
            f"{a.n_heads} heads x {a.d_head} ({kind}), d_ff {m.d_ff} | {cost['params'] / 1e6:.2f} M parameters, "
            f"{cost['flops_per_token'] / 1e6:.3g} MFLOPs/token | run directory {run_dir}")


MAX_EPOCHS_WITHOUT_WARNING = 10  # the default run makes 1 pass (topic classification: 6); old GPU recipes 170


def check_sizes(tc, dm) -> None:
    """The trainer's settings against the batches of the data (before the Trainer is built): a ConfigError, or a
    warning for a setting that would leave no number (`TrainerConfig.check_sizes`)."""
    n = {"train": len(dm.train_dataloader()), "val": len(dm.val_dataloader())}
    if tc.test:
        n["test"] = len(dm.test_dataloader())
    for warning in tc.trainer.check_sizes(n):
        log.warning(warning)


def warn_if_repeating(tc, dm) -> None:
    """A recipe that passes over a small training set many times measures memorisation: say so up front."""
    batches = tc.trainer.batches("train", len(dm.train_dataloader()))
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
