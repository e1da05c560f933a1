"""Activation patching per head: which heads carry what a clean input has and a corrupted one lacks.

For every head h, run the corrupted input with h's output (hook_z, every position) replaced by its output on the
clean input, and measure the metric against the clean labels. Written m_clean, m_corrupted and m_patched(h):

    recovered(h) = (m_patched(h) - m_corrupted) / (m_clean - m_corrupted)     1: the head alone restores it all

The two inputs must have the same shape (position t of one is position t of the other). For MQAR,
`corrupt_mqar_values` swaps the values of the context between examples, so recalling them gives another
example's answers: the heads whose clean output restores the answers are the ones that carry the recall.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mhalab.model import eval_mode
from mhalab.training.evaluation import evaluate
from mhalab.hooks import act_name, hooks, run_with_cache


def corrupt_mqar_values(batch: dict[str, Tensor], n_kv_pairs: int) -> dict[str, Tensor]:
    """A copy of an MQAR batch whose context values (positions 1, 3, ..., 2 n_kv_pairs - 1) are those of the next
    example in the batch; keys, queries and labels stay, so a model that recalls answers wrongly."""
    ids = batch["input_ids"].clone()  # (B, T)
    ids[:, 1:2 * n_kv_pairs:2] = batch["input_ids"].roll(1, dims=0)[:, 1:2 * n_kv_pairs:2]
    return {**batch, "input_ids": ids}


def _replace(heads: list[int], clean: Tensor):
    def fn(z: Tensor, _) -> Tensor:  # (B, T, H, D)
        z = z.clone()
        z[:, :, heads] = clean[:, :, heads]
        return z
    return fn


def _patched(module, clean_z, corrupted: dict[str, Tensor], heads, metric: str) -> float:
    """The metric of the corrupted batch with the (layer, head) pairs' outputs taken from the clean cache."""
    by_layer: dict[int, list[int]] = {}
    for l, h in heads:
        by_layer.setdefault(l, []).append(h)
    with hooks(module, [(act_name("z", l), _replace(hs, clean_z["z", l])) for l, hs in by_layer.items()]):
        return evaluate(module, [corrupted])[metric]


def _prepare(module, clean, corrupted):
    if clean["input_ids"].shape != corrupted["input_ids"].shape:
        raise ValueError(f"clean and corrupted inputs differ in shape: {tuple(clean['input_ids'].shape)} vs "
                         f"{tuple(corrupted['input_ids'].shape)}")
    with eval_mode(module):
        _, cache = run_with_cache(module, clean, names_filter=lambda n: n.endswith("hook_z"))
    return cache, {**corrupted, "labels": clean["labels"]}  # the corrupted run is scored on the clean answers


@torch.no_grad()
def patch(module, clean: dict[str, Tensor], corrupted: dict[str, Tensor], heads, metric: str = "acc") -> float:
    """The metric of the corrupted run with the outputs of all the (layer, head) pairs in `heads` replaced together
    by their clean outputs (a set of heads that carry something jointly)."""
    cache, corrupted = _prepare(module, clean, corrupted)
    return _patched(module, cache, corrupted, heads, metric)


@torch.no_grad()
def patch_heads(module, clean: dict[str, Tensor], corrupted: dict[str, Tensor], metric: str = "acc") -> dict:
    """Patch every head's clean output into the corrupted run, one head at a time.

    module: an AttentionLitModule (`module(batch)`); clean, corrupted: batches of the same shape; the clean batch's
    "labels" score both runs; metric: a key of `mhalab.training.evaluation.evaluate` ("acc", "loss", "bpb").
    Returns {"clean", "corrupted": float, "patched", "recovered": (n_layers, n_heads)}.
    """
    cache, corrupted = _prepare(module, clean, corrupted)
    m_clean = evaluate(module, [clean])[metric]
    m_corrupted = evaluate(module, [corrupted])[metric]
    layers = module.attention_layers()
    patched = torch.zeros(len(layers), layers[0].n_heads)  # (L, H)
    for l, layer in enumerate(layers):
        for h in range(layer.n_heads):
            patched[l, h] = _patched(module, cache, corrupted, [(l, h)], metric)
    gap = m_clean - m_corrupted
    recovered = (patched - m_corrupted) / gap if gap else torch.full_like(patched, float("nan"))
    return {"clean": m_clean, "corrupted": m_corrupted, "patched": patched, "recovered": recovered}
