"""Does running forward and backward inside `optimizer.step(closure)`, as Lightning's automatic optimisation does,
cost anything by itself? A plain loop on a kv_sweep-sized model (2 layers, d_model 64, 4 heads of 16, MQAR-sized
batches of 32 x 32), one torch thread, each step once outside and once inside a closure, in 9 alternating rounds of
30 steps; prints the ratio of process CPU time (closure / plain) and the median backward of each.

    python scripts/measure_closure_cost.py
"""

import statistics
import time

import torch

from mhalab.architecture import Architecture, AttentionConfig, ModelConfig
from mhalab.model import build_model


def main() -> None:
    torch.set_num_threads(1)
    arch = Architecture(vocab_size=69, objective="mlm", n_classes=None,
                        model=ModelConfig(d_model=64, n_layers=2, d_ff=128, dropout=0.0, max_len=64, pos="rotary",
                                          short_conv=3),
                        attention=AttentionConfig(n_heads=4, n_kv_heads=4, d_head=16))
    torch.manual_seed(0)
    model = build_model(arch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randint(0, 69, (32, 32)), torch.randint(0, 69, (32, 32))  # (B, T)
    backward = {"plain": [], "closure": []}

    def loss_and_backward(side: str) -> torch.Tensor:
        loss = torch.nn.functional.cross_entropy(model(x).logits.flatten(0, 1), y.flatten())
        opt.zero_grad()
        t = time.process_time()
        loss.backward()
        backward[side].append(time.process_time() - t)
        return loss

    def plain() -> None:
        loss_and_backward("plain")
        opt.step()

    def closure() -> None:
        opt.step(lambda: loss_and_backward("closure"))

    for _ in range(20):  # warm-up
        plain(), closure()
    for side in backward.values():
        side.clear()
    total = {"plain": 0.0, "closure": 0.0}
    for r in range(9):
        for name, step in ([("plain", plain), ("closure", closure)] if r % 2 == 0 else
                           [("closure", closure), ("plain", plain)]):
            t = time.process_time()
            for _ in range(30):
                step()
            total[name] += time.process_time() - t
    print(f"closure / plain, process CPU time: {total['closure'] / total['plain']:.3f}")
    print(f"median backward ms: plain {1000 * statistics.median(backward['plain']):.3f}, "
          f"closure {1000 * statistics.median(backward['closure']):.3f}")


if __name__ == "__main__":
    main()
