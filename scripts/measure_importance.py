"""Time head importance per example (mhalab.head_statistics.head_importance) against the old per-batch version.

The old version took |d(batch mean loss)/d gate| per batch; the new one takes |dL(x)/d gate| per example from the
hook_z gradients of one backward pass. A per-example loop (one forward/backward per example) is timed
as well, for scale. The methods alternate within each round, and each round's times are divided by the old
version's time of the same round (the machine may be shared); the medians over rounds are printed.
Usage: python scripts/measure_importance.py [--examples 32] [--batch 32] [--T 64] [--rounds 15] [--objective mlm]
"""
import argparse
import platform
import statistics
import time

import torch

from mhalab.hooks import act_name, hooks
from mhalab.training.module import AttentionLitModule
from mhalab.head_statistics import head_importance


def gated(model):
    """Gates of ones multiplying each head's output at hook_z, and the context that attaches them."""
    gates = [torch.ones(layer.n_heads, requires_grad=True) for layer in model.attention_layers()]
    fwd = [(act_name("z", i), lambda z, hook, g=g: z * g.view(1, 1, -1, 1)) for i, g in enumerate(gates)]
    return gates, hooks(model, fwd)


def old_per_batch(model, batches, loss_fn):
    """The previous implementation: mean over batches of |gradient of the batch's mean loss|, normalised."""
    gates, attached = gated(model)
    total = 0
    with attached:
        for batch in batches:
            grads = torch.autograd.grad(loss_fn(model, batch), gates)
            total = total + torch.stack([d.abs() for d in grads])
    imp = total / len(batches)
    return imp / imp.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def per_example_loop(model, batches, loss_fn):
    gates, attached = gated(model)
    total, n = 0, 0
    with attached:
        for batch in batches:
            for i in range(batch["input_ids"].shape[0]):
                ex = {k: v[i:i + 1] for k, v in batch.items()}
                if (ex["labels"] != -100).any():
                    total = total + torch.stack(torch.autograd.grad(loss_fn(model, ex), gates)).abs()
                    n += 1
    imp = total / n
    return imp / imp.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", type=int, default=32)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--T", type=int, default=64)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--objective", default="classification", choices=("classification", "mlm"))
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = dict(vocab_size=100, max_len=args.T, d_model=args.d_model, n_layers=2, n_heads=4, d_ff=4 * args.d_model,
               dropout=0.0)
    optim = dict(lr=1e-3, weight_decay=0.0, warmup_steps=0)
    n_classes = 3 if args.objective == "classification" else None
    model = AttentionLitModule(cfg, args.objective, n_classes, optim).eval()
    ids = torch.randint(5, 100, (args.examples, args.T))
    pad = torch.arange(args.T).view(1, -1) >= torch.randint(args.T // 2, args.T + 1, (args.examples, 1))
    if args.objective == "classification":
        labels = ids[:, 0] % 3
    else:
        labels = torch.where(pad | (torch.rand(args.examples, args.T) < 0.85), -100, ids)
    batches = [{"input_ids": ids[i:i + args.batch], "padding_mask": pad[i:i + args.batch],
                "labels": labels[i:i + args.batch]} for i in range(0, args.examples, args.batch)]
    loss_fn = lambda m, b: m.loss_and_logits(b)[0]  # noqa: E731

    def new(model, batches, loss_fn):
        return head_importance(model, batches, loss_fn)

    methods = {"old_per_batch": old_per_batch, "new_per_example": new, "loop_per_example": per_example_loop}
    assert torch.allclose(new(model, batches, loss_fn), per_example_loop(model, batches, loss_fn), atol=1e-5)
    times = {name: [] for name in methods}
    for r in range(args.rounds + 1):  # round 0 warms up and is dropped
        order = list(methods) if r % 2 == 0 else list(methods)[::-1]
        for name in order:
            t = time.perf_counter()
            methods[name](model, batches, loss_fn)
            if r:
                times[name].append(time.perf_counter() - t)
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, {args.threads} thread(s); "
          f"{args.examples} examples in batches of {args.batch}, T={args.T}, d_model={args.d_model}, 2 layers x 4 "
          f"heads, {args.objective}, {args.rounds} rounds")
    for name in methods:
        ratio = statistics.median(t / o for t, o in zip(times[name], times["old_per_batch"]))
        print(f"{name:18s} median {1e3 * statistics.median(times[name]):8.1f} ms   ratio to old {ratio:5.2f}")


if __name__ == "__main__":
    main()
