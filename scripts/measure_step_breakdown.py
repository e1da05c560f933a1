"""Where a run's training step spends its CPU time against the plain loop of `mhalab bench overhead`: process CPU
ms per step in the model's forward, the backward, the optimiser step, clipping, train/acc's count, batch reading and
the rest (Lightning's loop and hooks, the callbacks), each exclusive of the others, median of `rounds` alternating
rounds of 40 steps per side in one process (the bench's own `PlainRounds` callback, its steps timed by wrappers).

    python scripts/measure_step_breakdown.py [rounds] [override ...]   # default: 9 experiment=kv_sweep
"""
import collections
import statistics
import sys
import time

import torch

import mhalab.data.sampling as sampling
import mhalab.model as model
import mhalab.training.evaluation as evaluation
import mhalab.training.module as module
from mhalab.bench import overhead
from mhalab.bench.config import OverheadConfig

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 9
RECIPE = sys.argv[2:] or ["experiment=kv_sweep"]
STEPS, WARMUP = 40, 20
clock = time.process_time_ns
spent: collections.Counter = collections.Counter()
stack: list[int] = []
on = [False]


def timed(key, fn):
    """fn, its CPU time added to spent[key] less that of the timed calls inside it."""
    def wrapper(*args, **kwargs):
        if not on[0]:
            return fn(*args, **kwargs)
        stack.append(0)
        t = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            d = clock() - t
            spent[key] += d - stack.pop()
            if stack:
                stack[-1] += d
    return wrapper


for cls in (model.LanguageModel, model.SequenceClassifier):
    cls.forward = timed("model forward", cls.forward)
torch.Tensor.backward = timed("backward", torch.Tensor.backward)
torch.optim.AdamW.step = timed("optimiser step (run: with Lightning's closure)", torch.optim.AdamW.step)
torch.optim.Optimizer.zero_grad = timed("zero_grad", torch.optim.Optimizer.zero_grad)
torch.nn.utils.clip_grad_norm_ = timed("clipping", torch.nn.utils.clip_grad_norm_)
module.batch_correct = timed("train/acc count", evaluation.batch_correct)
module.mean_cross_entropy = timed("loss", evaluation.mean_cross_entropy)
sampling.EpochIndexed.__getitems__ = timed("batch reading", sampling.EpochIndexed.__getitems__)
rows: dict[str, list[float]] = collections.defaultdict(list)


def record(side: str, total_ns: int) -> None:
    for key, ns in spent.items():
        rows[f"{side}: {key}"].append(ns / STEPS / 1e6)
    rows[f"{side}: rest"].append((total_ns - sum(spent.values())) / STEPS / 1e6)
    rows[f"{side}: total"].append(total_ns / STEPS / 1e6)
    spent.clear()


class Breakdown(overhead.PlainRounds):
    def on_train_start(self, trainer, pl_module) -> None:
        self.plain_step, _ = overhead.plain_loop(trainer, pl_module, pool=STEPS, batches=self.batches)
        for _ in range(3):
            self.plain_step()
        self.t = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step < WARMUP or (step - WARMUP) % STEPS:
            return
        if self.t is not None:
            on[0] = False
            record("run", clock() - self.t)
            deterministic = torch.are_deterministic_algorithms_enabled()
            torch.use_deterministic_algorithms(False)  # as the bench's plain loop
            on[0], t = True, clock()
            for _ in range(STEPS):
                self.plain_step()
            on[0] = False
            record("plain", clock() - t)
            torch.use_deterministic_algorithms(deterministic)
            if len(rows["run: total"]) == ROUNDS:
                self.rows = [{}] * self.rounds
                trainer.should_stop = True
                return
        on[0], self.t = True, clock()


overhead.PlainRounds = Breakdown  # the bench's callback target, looked up by name when the run instantiates it
try:
    overhead.run_overhead(OverheadConfig(threads=1, rounds=1, steps_per_round=STEPS * (ROUNDS + 2), floor=False,
                                         recipe=RECIPE, out_dir="outputs/bench/step-breakdown"))
except KeyError:  # the bench's own table needs its rows, which this script does not fill
    pass
print(f"CPU ms per step, median of {ROUNDS} rounds of {STEPS} steps each side ({' '.join(RECIPE)}):")
for key in sorted(rows):
    print(f"  {key:55s} {statistics.median(rows[key]):7.3f}")
