"""Incremental decoding with a KV cache: per-token latency from MHA through GQA to MQA (the `decode` section).

For each (backend, batch, context), causal LanguageModels that differ only in n_kv_heads hold `context` tokens in
their caches (`Encoder.new_caches`), filled by a forward pass (prefill) or, beyond `prefill_max_tokens`, with random
keys and values (the values do not change the cost of a step). Every step then times one single-token step of each
model in turn (order reversed on odd steps), so load from other work falls on all of them alike. Reported per
model: median latency, cache bytes (checked against `cost.kv_cache_bytes`), the bytes a step must read at least
(`cost.decode_step_bytes`) over its latency, and, where B * context <= check_max_tokens after a prefill, the largest
logit difference between the first cached step and a full forward pass over the same tokens.
"""

from __future__ import annotations

import itertools
import time

import torch

from mhalab.bench.timing import MIB, median, memory_limit, out_of_memory, release, resolve_dtype, size, sync
from mhalab.cost import attention_peak_bytes, decode_step_bytes, encoder_params, kv_cache_bytes
from mhalab.model import LanguageModel
from mhalab.architecture import Architecture, AttentionConfig, ModelConfig


def decode_arch(spec: dict, max_len: int) -> Architecture:
    """The causal language model of one decode case (no dropout)."""
    return Architecture(vocab_size=spec["vocab_size"], objective="clm",
                        model=ModelConfig(d_model=spec["d_model"], n_layers=spec["n_layers"], d_ff=spec["d_ff"],
                                          dropout=0.0, pos=spec["pos"], max_len=max_len),
                        attention=AttentionConfig(n_heads=spec["n_heads"], n_kv_heads=spec["n_kv_heads"],
                                                  backend=spec["backend"]))


def group_bytes(specs: list[dict], dtype: torch.dtype) -> int:
    """Predicted memory of a decode group: every model's weights and preallocated caches, plus the largest
    prefill (one layer's activations and the logits of every position)."""
    elt = torch.empty((), dtype=dtype).element_size()
    s0 = specs[0]
    B, L = s0["batch"], s0["context"]
    total = L + s0["warmup_steps"] + s0["steps"]
    held = 0
    for spec in specs:
        arch = decode_arch(spec, total + 1)
        a = arch.attention
        held += encoder_params(arch) * elt + kv_cache_bytes(a.n_kv_heads, a.d_head, elt, total, arch.model.n_layers, B)
    prefill = 0
    if s0["prefill"]:
        d_head = s0["d_model"] // s0["n_heads"]
        prefill = (attention_peak_bytes(L, s0["d_model"], s0["n_heads"], d_head, s0["backend"], elt, B)
                   + B * L * (s0["vocab_size"] + s0["d_ff"]) * elt)
    return held + prefill


def decode_group(specs: list[dict], device: torch.device, dtype: torch.dtype) -> list[dict]:
    """Decode with several models that differ only in n_kv_heads (same batch and context), interleaved."""
    s0 = specs[0]
    L, B, steps, warm = s0["context"], s0["batch"], s0["steps"], s0["warmup_steps"]
    total = L + warm + steps
    torch.manual_seed(s0["seed"])
    ids = torch.randint(0, s0["vocab_size"], (B, total + 1), device=device)  # (B, total + 1)
    elt = torch.empty((), dtype=dtype).element_size()
    runs = []
    with torch.no_grad():
        for spec in specs:
            arch = decode_arch(spec, total + 1)
            torch.manual_seed(spec["seed"])
            model = LanguageModel(arch).to(device, dtype).eval()
            caches = model.encoder.new_caches(B, max_len=total, dtype=dtype)  # allocated now: filled below
            a = arch.attention
            row = {"d_head": a.d_head, "cache_filled_by": "prefill" if spec["prefill"] else "random",
                   "cache_bytes_closed": kv_cache_bytes(a.n_kv_heads, a.d_head, elt, L, arch.model.n_layers, B),
                   "step_bytes_closed": decode_step_bytes(arch, L, B, elt)}
            if spec["prefill"]:
                sync(device)
                t = time.perf_counter()
                model(ids[:, :L], caches=caches)
                sync(device)
                row["prefill_ms"] = 1e3 * (time.perf_counter() - t)
            else:
                for c in caches:
                    c.k[:, :, :L].normal_()  # (B, G, L, D)
                    c.v[:, :, :L].normal_()
                    c.length = L
            row["cache_bytes"] = sum(c.nbytes for c in caches)
            runs.append({"spec": spec, "model": model, "caches": caches, "row": row, "times": [], "first": None})
        for i in range(warm + steps):
            tok = ids[:, L + i:L + i + 1]  # (B, 1)
            for run in (runs if i % 2 == 0 else runs[::-1]):
                sync(device)
                t = time.perf_counter()
                logits = run["model"](tok, caches=run["caches"]).logits  # (B, 1, V)
                sync(device)
                if i >= warm:
                    run["times"].append(time.perf_counter() - t)
                if run["first"] is None:
                    run["first"] = logits[:, 0].float()  # (B, V)
        for run in runs:
            if run["spec"]["check"] and run["spec"]["prefill"]:
                full = run["model"](ids[:, :L + 1]).logits[:, L].float()  # (B, V): the same position, no cache
                run["row"]["max_abs_diff_vs_full"] = (full - run["first"]).abs().max().item()
    out = []
    for run in runs:
        row, ts = run["row"], run["times"]
        row.update(latency_ms=1e3 * median(ts), latency_ms_min=1e3 * min(ts), tokens_per_s=B / median(ts),
                   cache_mib=row["cache_bytes"] / MIB, implied_gb_per_s=row["step_bytes_closed"] / median(ts) / 1e9)
        out.append(row)
    del runs
    release(device)
    return out


def decode_case(spec: dict, device: torch.device, dtype: torch.dtype) -> dict:
    """decode_group for one model."""
    return decode_group([spec], device, dtype)[0]


def decode_section(cfg, device: torch.device) -> tuple[list[dict], list[str]]:
    """Every (backend, batch, context) group of cfg.decode; groups that would not fit in memory are skipped."""

    d, dtype = cfg.decode, resolve_dtype(cfg.dtype)
    rows, skipped = [], []
    groups = list(itertools.product(cfg.backends, sorted(d.batch), sorted(d.context)))
    for i, (backend, B, L) in enumerate(groups):
        prefill = d.prefill_max_tokens is None or B * L <= d.prefill_max_tokens
        specs = [dict(backend=backend, batch=B, context=L, n_kv_heads=g, n_heads=d.n_heads, d_model=d.d_model,
                      n_layers=d.n_layers, d_ff=d.d_ff, vocab_size=d.vocab_size, pos=d.pos, steps=d.steps,
                      warmup_steps=d.warmup_steps, seed=cfg.seed, check=B * L <= d.check_max_tokens,
                      prefill=prefill) for g in d.kv_heads()]
        head = f"[decode {i + 1}/{len(groups)}] {backend:<4} B={B:<3} L={L:<6}"
        need, limit = group_bytes(specs, dtype), memory_limit(cfg, device)
        if need > limit:
            skipped.append(f"decode: {backend} B={B} context={L} skipped: predicted {size(need)} > {size(limit)} "
                           "allowed")
            print(f"{head} {skipped[-1]}", flush=True)
            continue
        try:
            results = decode_group(specs, device, dtype)
        except RuntimeError as e:
            if not out_of_memory(e):
                raise
            release(device)
            skipped.append(f"decode: {backend} B={B} context={L} skipped: out of memory although predicted to fit")
            print(f"{head} {skipped[-1]}", flush=True)
            continue
        group = []
        for spec, res in zip(specs, results):
            row = {k: spec[k] for k in ("backend", "batch", "context", "n_heads", "n_kv_heads", "d_model", "n_layers")}
            row.update(res)
            group.append(row)
        ref = next((r for r in group if r["n_kv_heads"] == d.n_heads), None)
        for r in group:
            if ref is not None:
                r["speedup_vs_mha"] = ref["latency_ms"] / r["latency_ms"]
                r["cache_ratio_vs_mha"] = r["cache_bytes"] / ref["cache_bytes"]
        print(f"{head} ms/token by n_kv_heads: " + ", ".join(f"{r['n_kv_heads']}: {r['latency_ms']:.2f}"
                                                              for r in group), flush=True)
        rows += group
    return rows, skipped
