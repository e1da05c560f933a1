"""Train-step time of the model with hook points against the same model before them, in one process.

`mhalab bench train` compares mhalab against torch.nn.TransformerEncoder, not two versions of mhalab; so this script
loads the old attention.py and model.py from git (commit a08120a, before the hook points) as modules of their own,
builds both models at `mhalab bench train`'s default sizes with the same weights, and times training steps (AdamW,
cross-entropy, dropout on, nothing attached) alternating in rounds with the bench's own `interleaved`.
Ratio = old step time / new step time per round (>= 1: the hooked model is no slower).

    PYTHONPATH=src python scripts/measure_hooks_overhead.py [rounds] [threads]
"""

import statistics
import subprocess
import sys
import types

import torch

from mhalab.bench.config import ThroughputConfig
from mhalab.bench.throughput import synthetic_batch
from mhalab.bench.timing import interleaved
from mhalab.training.evaluation import mean_cross_entropy
from mhalab.model import build_model

OLD = "a08120a"


def old_module(name: str, path: str, replace: tuple[tuple[str, str], ...] = ()) -> types.ModuleType:
    src = subprocess.check_output(["git", "show", f"{OLD}:{path}"], text=True)
    for a, b in replace:
        src = src.replace(a, b)
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(src, f"{OLD}:{path}", "exec"), module.__dict__)
    return module


def main(rounds: int = 21, threads: int = 1) -> None:
    torch.set_num_threads(threads)
    moved = (("from mhalab.schema import", "from mhalab.architecture import"),)  # schema's model part moved since
    old_module("old_attention", "src/mhalab/attention.py", moved)
    old_model = old_module("old_model", "src/mhalab/model.py",
                           (("from mhalab.attention import", "from old_attention import"), *moved))
    cfg = ThroughputConfig()
    arch = cfg.architecture(cfg.n_heads[0])
    torch.manual_seed(0)
    new = build_model(arch)
    old = old_model.build_model(arch)
    missing, unexpected = old.load_state_dict(new.state_dict(), strict=False)
    assert not unexpected and all(k.endswith("head_gate") for k in missing), (missing, unexpected)
    batch = synthetic_batch(arch, cfg.batch, cfg.seq_len, torch.Generator().manual_seed(0), padded=False)

    def make_step(model):
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
        model.train()

        def step():
            opt.zero_grad(set_to_none=True)
            logits = model(batch["input_ids"]).logits  # (B, T, V)
            mean_cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1)).backward()
            opt.step()
        return step

    old_s, new_s = interleaved([make_step(old), make_step(new)], rounds, torch.device("cpu"),
                               min_calls=cfg.steps_per_round, warmup=cfg.warmup_steps)
    ratios = sorted(o / n for o, n in zip(old_s, new_s))
    print(f"{arch.model.n_layers} layers, d_model {arch.model.d_model}, {arch.attention.n_heads} heads, batch "
          f"{cfg.batch} x {cfg.seq_len} tokens, {threads} thread(s), {rounds} rounds x {cfg.steps_per_round} steps")
    print(f"step: old {statistics.median(old_s) * 1e3:.1f} ms, hooked {statistics.median(new_s) * 1e3:.1f} ms "
          "(medians)")
    print(f"ratio old/hooked per round: median {statistics.median(ratios):.4f}, range [{ratios[0]:.4f}, "
          f"{ratios[-1]:.4f}]")


if __name__ == "__main__":
    main(*map(int, sys.argv[1:]))
