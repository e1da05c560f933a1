"""Per-head attention statistics (REFERENCE.md section 3): pure tensor functions, torch only.

Conventions: `weights` is (B, H, T, S) with each row summing to 1 over its valid keys; `key_padding_mask` is
(B, S) bool with True = padding (PyTorch convention). For self-attention (T == S) the padded positions are also
padding queries and are left out of every average. Everything is computed in float32.
"""

import math

import torch
from torch import Tensor

from mhalab.heads import kv_head_of, resolve_heads

STAT_NAMES = (
    "entropy", "entropy_norm", "confidence", "distance", "argmax_distance",
    "first_token", "self", "prev", "next",
)


def _masks(weights: Tensor, key_padding_mask: Tensor | None, causal: bool) -> tuple[Tensor, Tensor]:
    """Key validity (B, T, S) and query validity (B, T) as bool tensors."""
    B, H, T, S = weights.shape
    dev = weights.device
    key_ok = torch.ones(B, T, S, dtype=torch.bool, device=dev)  # (B, T, S)
    query_ok = torch.ones(B, T, dtype=torch.bool, device=dev)  # (B, T)
    if key_padding_mask is not None:
        if key_padding_mask.shape != (B, S):
            raise ValueError(f"key_padding_mask must have shape {(B, S)}, got {tuple(key_padding_mask.shape)}")
        valid = ~key_padding_mask.to(device=dev, dtype=torch.bool)  # (B, S)
        key_ok = key_ok & valid[:, None, :]
        if T == S:  # self-attention: padded positions are padding queries too
            query_ok = valid.clone()
    if causal:
        key_ok = key_ok & torch.ones(T, S, dtype=torch.bool, device=dev).tril()
    return key_ok, query_ok


def _query_mean(x: Tensor, query_ok: Tensor) -> Tensor:
    """Mean of x (B, H, T) over batch and valid queries -> (H,)."""
    w = query_ok[:, None, :].float()  # (B, 1, T)
    return (x * w).sum(dim=(0, 2)) / w.sum().clamp_min(1.0)


@torch.no_grad()
def head_stats(weights: Tensor, key_padding_mask: Tensor | None = None, *, causal: bool = False) -> dict[str, Tensor]:
    """Per-head statistics of one layer's attention, each of shape (H,).

    Averages over batch and valid query positions. Keys:
      entropy          -sum_j a ln a in nats (0 ln 0 = 0)
      entropy_norm     entropy / ln(n valid keys of the row), in [0, 1]; defined as 0 for a row with one valid key
      confidence       max_j a[i, j]
      distance         sum_j a[i, j] |i - j| (expected distance)
      argmax_distance  |i - argmax_j a[i, j]| (first index on ties)
      first_token      a[i, 0]
      self, prev, next a[i, i], a[i, i-1], a[i, i+1] (0 where that key is out of range or padding)
    With causal=True the valid keys of row i are j <= i (only matters for entropy_norm: the rows already carry
    no weight there). Weights on invalid keys are treated as 0.
    """
    if weights.dim() != 4:
        raise ValueError(f"weights must be (B, H, T, S), got shape {tuple(weights.shape)}")
    B, H, T, S = weights.shape
    key_ok, query_ok = _masks(weights, key_padding_mask, causal)
    a = weights.float() * key_ok[:, None]  # (B, H, T, S)

    i = torch.arange(T, device=a.device)[:, None]  # (T, 1)
    j = torch.arange(S, device=a.device)[None, :]  # (1, S)
    offset = (j - i).float()  # (T, S)

    entropy = -torch.xlogy(a, a).sum(-1)  # (B, H, T)
    n_keys = key_ok.sum(-1).float()  # (B, T)
    log_n = torch.log(n_keys.clamp_min(1.0))[:, None, :]  # (B, 1, T)
    entropy_norm = torch.where(log_n > 0, entropy / log_n.clamp_min(1e-12), torch.zeros_like(entropy))
    confidence, argmax = a.max(-1)  # (B, H, T), (B, H, T)
    distance = (a * offset.abs()).sum(-1)  # (B, H, T)
    argmax_distance = (argmax - torch.arange(T, device=a.device)).abs().float()  # (B, H, T)

    def diag(k: int) -> Tensor:  # a[i, i + k], 0 where out of range
        return (a * (offset == k).float()).sum(-1)  # (B, H, T)

    per_query = {
        "entropy": entropy,
        "entropy_norm": entropy_norm,
        "confidence": confidence,
        "distance": distance,
        "argmax_distance": argmax_distance,
        "first_token": a[..., 0],
        "self": diag(0),
        "prev": diag(-1),
        "next": diag(1),
    }
    return {k: _query_mean(v, query_ok) for k, v in per_query.items()}


@torch.no_grad()
def head_similarity(weights: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
    """Mean Jensen-Shannon divergence (nats, in [0, ln 2]) between every pair of heads' rows -> (H, H).

    Averaged over batch and valid queries (as in head_stats); symmetric with a zero diagonal.
    Memory: one (B, H, T, S) temporary per head, looping over heads.
    """
    if weights.dim() != 4:
        raise ValueError(f"weights must be (B, H, T, S), got shape {tuple(weights.shape)}")
    B, H, T, S = weights.shape
    key_ok, query_ok = _masks(weights, key_padding_mask, causal=False)
    a = weights.float() * key_ok[:, None]  # (B, H, T, S)
    ent = -torch.xlogy(a, a).sum(-1)  # (B, H, T)
    sim = torch.zeros(H, H, device=a.device)
    for h in range(H - 1):
        m = 0.5 * (a[:, h : h + 1] + a[:, h + 1 :])  # (B, H-h-1, T, S)
        ent_m = -torch.xlogy(m, m).sum(-1)  # (B, H-h-1, T)
        jsd = ent_m - 0.5 * (ent[:, h : h + 1] + ent[:, h + 1 :])  # JSD = H(M) - (H(P) + H(Q)) / 2
        row = _query_mean(jsd.clamp(0.0, math.log(2.0)), query_ok)  # (H-h-1,)
        sim[h, h + 1 :] = row
        sim[h + 1 :, h] = row
    return sim


def kv_group_similarity(similarity: Tensor, n_kv_heads: int) -> dict:
    """Summarise an (H, H) head similarity by GQA group (query head i reads KV head i // (H // n_kv_heads)).

    Returns {"within_group_jsd": mean over pairs in the same group (nan if groups have 1 head),
    "between_group_jsd": mean over pairs in different groups (nan if one group), "per_group": [mean per group]}.
    """
    H = similarity.shape[0]
    if similarity.shape != (H, H):
        raise ValueError(f"similarity must be square (H, H), got shape {tuple(similarity.shape)}")
    resolve_heads(H, H, n_kv_heads, 1)  # n_kv_heads must divide n_heads
    sim = similarity.detach().float().cpu()
    group = torch.tensor([kv_head_of(h, H, n_kv_heads) for h in range(H)])  # (H,)
    pair = torch.ones(H, H, dtype=torch.bool).triu(1)  # each unordered pair once
    same = group[:, None] == group[None, :]  # (H, H)

    def mean(sel: Tensor) -> float:
        return sim[sel].mean().item() if sel.any() else float("nan")

    return {
        "within_group_jsd": mean(pair & same),
        "between_group_jsd": mean(pair & ~same),
        "per_group": [mean(pair & same & (group[:, None] == g)) for g in range(n_kv_heads)],
    }


def head_importance(model, batches, loss_fn, normalize: bool = True) -> Tensor:
    """Head importance I_h = E_batches |dL / d head_gate_h| (Michel et al. 2019) -> (n_layers, n_heads).

    `model.attention_layers()` lists the attention modules in layer order, each with a `head_gate` buffer of ones
    (n_heads,); `loss_fn(model, batch)` returns a scalar loss. Uses autograd.grad, so parameters' .grad is left
    untouched; the gates get requires_grad only while this runs. With `normalize`, each layer is divided by its
    l2 norm over heads (an all-zero layer stays zero). Train/eval mode is the caller's choice (eval: no dropout).
    """
    gates = [layer.head_gate for layer in model.attention_layers()]
    if not gates:
        raise ValueError("model.attention_layers() returned no layers")
    total, n = None, 0
    try:
        for g in gates:
            g.requires_grad_(True)
        with torch.enable_grad():
            for batch in batches:
                loss = loss_fn(model, batch)
                grads = torch.autograd.grad(loss, gates, allow_unused=True)
                step = torch.stack([
                    torch.zeros_like(g, dtype=torch.float32) if d is None else d.detach().float().abs()
                    for g, d in zip(gates, grads)
                ])  # (L, H)
                total = step if total is None else total + step
                n += 1
    finally:
        for g in gates:
            g.requires_grad_(False)
    if n == 0:
        raise ValueError("head_importance needs at least one batch")
    imp = total / n  # (L, H)
    if normalize:
        imp = imp / imp.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return imp


def layer_stats(attentions: list[Tensor], key_padding_mask: Tensor | None, causal: bool,
                n_kv_heads: int) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Statistics of every layer of a model from its attention weights (one (B, H, T, S) tensor per layer).

    Returns ({stat: (n_layers, n_heads)} for each of STAT_NAMES, {"within_group_jsd" | "between_group_jsd":
    (n_layers,)}), float32 on the CPU. Per-head results stay (layer, head) tensors; labels are made only for display.
    """
    per_layer = [head_stats(w, key_padding_mask, causal=causal) for w in attentions]
    stats = {name: torch.stack([s[name] for s in per_layer]).float().cpu() for name in STAT_NAMES}
    groups = [kv_group_similarity(head_similarity(w, key_padding_mask), n_kv_heads) for w in attentions]
    group_stats = {key: torch.tensor([g[key] for g in groups], dtype=torch.float32)
                   for key in ("within_group_jsd", "between_group_jsd")}
    return stats, group_stats
