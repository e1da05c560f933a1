"""Per-head attention statistics (docs/definitions.md#per-head-statistics): pure tensor functions, torch only.

Conventions: `weights` is (B, H, T, S) with each row summing to 1 over its valid keys; `key_padding_mask` is
(B, S) bool with True = padding (PyTorch convention). For self-attention (T == S) the padded positions are also
padding queries and are left out of every average. Everything is computed in float32.
"""

import math
from collections.abc import Mapping

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

    Averages over batch and valid query positions (docs/definitions.md#masks-and-averaging). Keys:
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

    Definition: docs/definitions.md#head-similarity. Averaged over batch and valid queries (as in head_stats);
    symmetric with a zero diagonal.
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


def _predicted_counts(batch, n_examples: int, device: torch.device) -> Tensor:
    """Predicted items (labels other than -100) of each example of a batch -> (B,) float32; 1 each without labels."""
    labels = batch.get("labels") if isinstance(batch, Mapping) else None
    if labels is None:
        return torch.ones(n_examples, device=device)
    return (labels != -100).reshape(labels.shape[0], -1).sum(1).to(device=device, dtype=torch.float32)


def head_importance(model, batches, loss_fn, normalize: bool = True) -> Tensor:
    """Head importance I_h = mean over examples x of |dL(x) / dg_h| at g_h = 1, g_h a gate multiplying head h's
    output (Michel et al. 2019) -> (L, H).

    Definition: docs/definitions.md#head-importance. The absolute value is taken per example and the mean runs
    over every example of every batch, so the result does not depend on how the examples are batched. The loss of
    one example, L(x), is its mean loss over its own predicted items: a classifier example's loss; for a language
    model the mean over the example's tokens whose label is not -100 (Michel et al.'s code instead takes |.| per
    token). An example with no predicted item contributes nothing and is not counted; a batch with none is skipped.

    Contract: `loss_fn(model, batch)` returns the batch's MEAN loss, the sum of the per-item losses over the number
    of predicted items in the batch (as `F.cross_entropy(..., ignore_index=-100)`); `batch` is a dict of tensors
    with a leading batch dimension whose "labels" ((B,) or (B, T), -100 = ignored) mark the predicted items
    (without "labels" each example counts as one item); examples do not interact in the forward pass (no batch
    norm). The heads are reached through the hook point `hook_z` of every layer (`mhalab.hooks`).

    Method, one forward and one backward per batch: a hook multiplies z_h, head h's output at hook_z, by a gate
    g_h = 1 and keeps the product; dL(x)/dg_h = sum over x's positions of <dL(x)/dz_h, z_h>. Since examples do not
    interact, example x's slice of d(batch mean)/dz is (n_x / N) dL(x)/dz (n_x: x's predicted items, N: the
    batch's), so dL(x)/dg_h = (N / n_x) sum <d(batch mean)/dz_h, z_h>. This is exact (the tests check it against one
    autograd.grad per example). A head removed by an earlier hook (`mhalab.analysis.ablate.zero_heads`, e.g. pruned) has
    z_h = 0 and gets 0, as in Michel et al.'s code, which differentiates with respect to the masked head's output.

    Uses autograd.grad, so parameters' .grad is left untouched; the gates require grad, so the graph reaches the
    heads even in a frozen model; the hooks are detached when it returns, even on error. With `normalize`, each
    layer is divided by its l2 norm over heads (an all-zero layer stays zero); a head with no output path gets 0.
    Train/eval mode is the caller's choice (eval: no dropout).
    """
    from mhalab.hooks import act_name, attention_layers, hooks

    layers = attention_layers(model)
    if not layers:
        raise ValueError("the model has no attention layers")
    H = layers[0][1].n_heads
    if any(layer.n_heads != H for _, layer in layers):
        raise ValueError(f"every layer must have the same number of heads, got {[l.n_heads for _, l in layers]}")
    seen: list[list[Tensor]] = [[] for _ in layers]  # gated head outputs (B, T, H, D) of the current batch, per layer
    gates = [torch.ones(H, requires_grad=True) for _ in layers]

    def keep(i: int):
        def hook(z: Tensor, _) -> Tensor:
            # contiguous: the gated z is then laid out as out_proj reads it, and dL/dz comes back in that layout
            gated = (z * gates[i].to(device=z.device, dtype=z.dtype).view(1, 1, H, 1)).contiguous()  # (B, T, H, D)
            seen[i].append(gated)
            return gated
        return hook

    total = torch.zeros(len(layers), H)  # (L, H)
    n_examples = 0
    with hooks(model, [(act_name("z", layer), keep(i)) for i, (layer, _) in enumerate(layers)]), torch.enable_grad():
        for batch in batches:
            labels = batch.get("labels") if isinstance(batch, Mapping) else None
            if labels is not None and not (labels != -100).any():
                continue  # nothing predicted: the batch's mean loss is undefined
            for s in seen:
                s.clear()
            loss = loss_fn(model, batch)
            zs = [z for s in seen for z in s]
            if not zs:
                raise ValueError("loss_fn did not run any attention layer")
            dzs = torch.autograd.grad(loss, zs, allow_unused=True)
            B = zs[0].shape[0]
            counts = _predicted_counts(batch, B, total.device)  # (B,)
            if counts.shape[0] != B:
                raise ValueError(f"labels hold {counts.shape[0]} examples but the attention layers saw a batch of {B}")
            valid = counts > 0
            scale = torch.where(valid, counts.sum() / counts.clamp_min(1.0), torch.zeros_like(counts))  # N / n_x
            it = iter(dzs)
            for i, s in enumerate(seen):
                per_example = torch.zeros(B, H)  # (B, H): dL(x)/dg_h
                for z in s:
                    dz = next(it)
                    if dz is None:
                        continue
                    prod = (dz.detach().float() * z.detach().float()).reshape(B, -1, H, z.shape[-1])  # (B, T, H, D)
                    per_example += prod.sum(dim=(1, 3)).cpu()  # (B, H)
                total[i] += (per_example * scale[:, None]).abs()[valid].sum(0)
            n_examples += int(valid.sum())
    for s in seen:
        s.clear()
    if n_examples == 0:
        raise ValueError("head_importance needs at least one example with a predicted item")
    imp = total / n_examples  # (L, H)
    if normalize:
        imp = imp / imp.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return imp


def probe_cache(module, batch, points=("pattern",)):
    """The cache (`mhalab.hooks.ActivationCache`) of the hook points named in `points` ("pattern", "z", ...) of every
    layer on one batch: a no-grad pass in eval mode, `module(batch)` as an AttentionLitModule is called."""
    from mhalab.model import eval_mode
    from mhalab.hooks import run_with_cache

    wanted = {f"hook_{p.removeprefix('hook_')}" for p in points}
    with torch.no_grad(), eval_mode(module):
        _, cache = run_with_cache(module, batch, names_filter=lambda name: name.rsplit(".", 1)[-1] in wanted)
    return cache


def attention_patterns(module, batch) -> list[Tensor]:
    """Every layer's attention weights (B, H, T, S) on one batch, through hook_pattern (see `probe_cache`)."""
    cache = probe_cache(module, batch)
    return [cache["pattern", layer] for layer in range(cache.n_layers)]


class HeadStatistic:
    """Your own statistic of every head, computed beside the built-in ones on the probe batch and logged and saved
    like them (`stats.extra.<name>={_target_: your_package.YourClass}` in a training config, your package allowed).

    `points`: the hook points it reads (`mhalab.hooks.POINTS`); `__call__(cache, batch)` gets the cache of those
    points (`cache["pattern", layer]`: (B, H, T, S)) and the probe batch (input_ids, padding_mask, labels) and
    returns an (n_layers, n_heads) tensor. Subclassing is optional: any object with these two will do.
    """

    points: tuple[str, ...] = ("pattern",)

    def __call__(self, cache, batch: dict) -> Tensor:
        raise NotImplementedError


# -- head detectors (TransformerLens's head_detector, "mul" measure) ---------------------------------------------

DETECTOR_NAMES = ("prev_token_score", "duplicate_token_score", "induction_score")


def repeated_random_tokens(pool: Tensor, n_examples: int, half: int, seed: int = 0) -> Tensor:
    """(n_examples, 2 * half) ids: `half` tokens drawn uniformly from `pool` (1-D ids), then the same again."""
    g = torch.Generator().manual_seed(seed)
    first = pool[torch.randint(0, pool.numel(), (n_examples, half), generator=g)]  # (B, half)
    return torch.cat((first, first), dim=1)  # (B, 2 * half)


def detection_patterns(ids: Tensor) -> dict[str, Tensor]:
    """TransformerLens's detection patterns of a batch of ids (B, T), each (B, T, T) with 1 where the head should
    attend (query i, key j, always j < i): the previous token (j = i - 1); an earlier copy of the current token
    (ids[j] = ids[i]); the token after an earlier copy of the current token (ids[j - 1] = ids[i], induction)."""
    B, T = ids.shape
    before = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril(-1)  # (T, T): j < i
    same = (ids[:, :, None] == ids[:, None, :]) & before  # (B, T, T)
    after_copy = torch.zeros_like(same)
    after_copy[:, :, 1:] = same[:, :, :-1]  # key j where ids[j - 1] = ids[i], j - 1 < i
    prev = torch.zeros(T, T, dtype=torch.bool, device=ids.device)
    prev[1:, :-1] = torch.eye(T - 1, dtype=torch.bool, device=ids.device)
    return {"prev_token_score": prev.expand(B, T, T), "duplicate_token_score": same,
            "induction_score": after_copy & before}


@torch.no_grad()
def detector_scores(patterns: list[Tensor], ids: Tensor) -> dict[str, Tensor]:
    """{name: (L, H)} for DETECTOR_NAMES: per example, the attention mass on the detection pattern over the total
    mass, sum(a * d) / sum(a) over every query and key; then the mean over examples. patterns: one (B, H, T, T)
    per layer on the ids (B, T)."""
    out = {}
    for name, det in detection_patterns(ids).items():
        det = det[:, None].float()  # (B, 1, T, T)
        per_layer = []
        for a in patterns:
            a = a.float()  # (B, H, T, T)
            per_layer.append(((a * det).sum((-2, -1)) / a.sum((-2, -1)).clamp_min(1e-12)).mean(0))  # (H,)
        out[name] = torch.stack(per_layer).cpu()  # (L, H)
    return out


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
