"""One definition of the evaluation metrics, of head importance and of eval mode, used by training, ablation,
pruning and conversion alike.

Metrics are token-weighted over every predicted position (label != -100) of the evaluated batches:
    loss = sum of cross-entropy (nats) / predicted positions
    acc  = correct predictions / predicted positions
    bpb  = sum of cross-entropy / (ln 2 * UTF-8 bytes of the predicted tokens)   (language modelling only)
They are computed from four running sums (`batch_sums`), so that batches, processes and epochs add up exactly.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor

from mhalab.errors import ConfigError
from mhalab.model import eval_mode

IGNORE_INDEX = -100


def batch_sums(logits: Tensor, labels: Tensor, token_bytes: Tensor | None = None) -> Tensor:
    """(nats, correct, count, bytes) of one batch as a float64 tensor (4,).

    logits (N, C), labels (N,) with IGNORE_INDEX where nothing is predicted; token_bytes (C,) the UTF-8 length of
    each class (token) for bits per byte, or None (then bytes = 0).
    """
    valid = labels != IGNORE_INDEX  # (N,)
    lg, lb = logits.float()[valid], labels[valid]
    nats = F.cross_entropy(lg, lb, reduction="sum") if lb.numel() else lg.sum() * 0
    correct = (lg.argmax(-1) == lb).sum()
    nbytes = token_bytes[lb].sum() if token_bytes is not None else torch.zeros((), device=lb.device)
    return torch.stack([nats.detach().double(), correct.double(), torch.tensor(float(lb.numel()),
                        dtype=torch.float64, device=lb.device), nbytes.double()])


def batch_correct(logits: Tensor, labels: Tensor) -> Tensor:
    """`batch_sums` without the loss and bytes: (0, correct, count, 0) as a float64 tensor (4,), for the training
    accuracy (the step computes its loss once). logits (N, C), labels (N,) with IGNORE_INDEX where nothing is
    predicted. On the CPU the argmax runs on the predicted rows only: half the cost in a kv_sweep step, where 4 of
    32 positions are predicted (docs/performance.md)."""
    valid = labels != IGNORE_INDEX  # (N,)
    count = valid.sum()
    if labels.device.type == "cpu" and int(count) < labels.numel():  # (no sync on an accelerator)
        logits, labels = logits[valid], labels[valid]  # (n, C), (n,)
    correct = (logits.argmax(-1) == labels).sum()  # IGNORE_INDEX (< 0) is never a class
    zero = torch.zeros((), dtype=torch.float64, device=labels.device)
    return torch.stack([zero, correct.double(), count.double(), zero])


def metrics_from_sums(sums: Tensor, bits_per_byte: bool) -> dict[str, float]:
    """{loss, acc[, bpb]} from accumulated `batch_sums`."""
    nats, correct, count, nbytes = (float(x) for x in sums)
    out = {"loss": nats / max(count, 1.0), "acc": correct / max(count, 1.0)}
    if bits_per_byte:
        out["bpb"] = nats / (math.log(2) * max(nbytes, 1.0))
    return out


def split_batches(dm, split: str, max_batches: int | None = None) -> list[dict[str, Tensor]]:
    """The first `max_batches` batches of a split, materialised once (MLM masks are fixed for val/test)."""
    loader = dm.val_dataloader() if split == "validation" else dm.test_dataloader()
    out = []
    for i, b in enumerate(loader):
        if max_batches is not None and i >= max_batches:
            break
        out.append(b)
    if not out:
        raise ConfigError(f"the {split} split is empty")
    return out


@torch.no_grad()
def evaluate(module, batches: Iterable[dict[str, Tensor]]) -> dict[str, float]:
    """The metrics of `module` (an `AttentionLitModule`) over the batches, in eval mode."""
    total = torch.zeros(4, dtype=torch.float64)
    with eval_mode(module):
        for batch in batches:
            logits, labels = module.logits_and_labels(module.to_device(batch))
            total += batch_sums(logits, labels, module.token_bytes).cpu()
    return metrics_from_sums(total, module.reports_bpb)


def headline(metrics: dict) -> str:
    """The metric a result is judged by: bits per byte for text language models, else accuracy."""
    return "bpb" if "bpb" in metrics else "acc"


def mean_cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    """The training loss: mean cross-entropy over the predicted positions. logits (N, C), labels (N,)."""
    return F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX)


def mean_loss(module, batch: dict[str, Tensor]) -> Tensor:
    """The training loss of one batch."""
    return mean_cross_entropy(*module.logits_and_labels(batch))


def float32_pass(module):
    """A context with autocast off on the module's device: what runs in it computes in the parameters' dtype
    (float32 in a bf16-mixed or 16-mixed run), as head statistics and importance do wherever they are called."""
    return torch.autocast(device_type=next(module.parameters()).device.type, enabled=False)


def importance(module, batches: Iterable[dict[str, Tensor]], normalize: bool = True) -> Tensor:
    """(n_layers, n_heads) head importance (Michel et al. 2019) over the examples of `batches`, in eval mode
    (no dropout) and in the parameters' dtype (`float32_pass`); heads removed by an attached hook
    (`mhalab.analysis.ablate.zero_heads`) get 0. See `mhalab.head_statistics.head_importance`."""
    from mhalab.head_statistics import head_importance

    with eval_mode(module), float32_pass(module):
        return head_importance(module, (module.to_device(b) for b in batches), mean_loss, normalize=normalize)
