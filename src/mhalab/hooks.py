"""Hook points: the one way to reach every head, with TransformerLens's names and conventions.

Every `MultiHeadAttention` has these points; in a model (anything with `attention_layers()`) layer l's are named
`blocks.{l}.attn.hook_{point}` (as in TransformerLens and as the modules sit in `model.encoder.blocks`), on a bare
layer `hook_{point}`:

    hook_q            (B, T, H, D)        queries, after rotary
    hook_k, hook_v    (B, S, G, D)        keys (after rotary) and values of the new positions (G = n_kv_heads)
    hook_attn_scores  (B, H, T, S)        scaled scores, masked keys at -inf          [runs the math path]
    hook_pattern      (B, H, T, S)        attention weights, before dropout            [runs the math path]
    hook_z            (B, T, H, D)        each head's output, the input of out_proj: gate, ablate or patch here
    hook_result       (B, T, H, d_model)  each head's share of the output (out = sum over heads + bias)
                                          [computed only while a hook is attached here]

A hook is `fn(tensor, hook) -> tensor | None` (None keeps the tensor, a tensor of the same shape replaces it);
`hook.name`, `hook.layer` and `hook.point` say where it runs. Hooks run in the order they were attached and are
detached when the `hooks(...)` block ends, also after an error. With nothing attached a layer runs exactly as
without hooks (one dict check): training keeps the fused sdpa kernel.

    with hooks(model, [("blocks.0.attn.hook_z", zero_head_2)]):      # or run_with_hooks(model, x, fwd_hooks=...)
        logits = model(x)
    out, cache = run_with_cache(model, x, names_filter=lambda n: n.endswith("hook_pattern"))
    cache["pattern", 0][:, 3]                                           # (B, T, S): layer 0, head 3
    cache["pattern", 0, "attn"], cache["attn", -1]                      # TL's other forms (ActivationCache)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Union

from torch import Tensor, nn

POINTS = ("q", "k", "v", "attn_scores", "pattern", "z", "result")
PATTERN_POINTS = frozenset({"attn_scores", "pattern"})  # need the explicit softmax (math path)

HookFn = Callable[[Tensor, "Hook"], Union[Tensor, None]]
NameFilter = Union[None, str, Iterable[str], Callable[[str], bool]]


@dataclass(frozen=True)
class Hook:
    """Where a hook function runs: its full name, layer index (None on a bare layer) and point ("q", "z", ...)."""

    name: str
    layer: int | None
    point: str


def act_name(point: str, layer: int | None = None) -> str:
    """The full name of a hook point, TransformerLens's `utils.get_act_name`: act_name("pattern", 0) ->
    "blocks.0.attn.hook_pattern"; with layer None, the bare layer's "hook_pattern"."""
    point = point.removeprefix("hook_")
    if point not in POINTS:
        raise ValueError(f"unknown hook point {point!r}; the points are {', '.join(POINTS)}")
    return f"hook_{point}" if layer is None else f"blocks.{layer}.attn.hook_{point}"


def attention_layers(model: nn.Module) -> list[tuple[int | None, nn.Module]]:
    """(layer index, attention layer) of a model with `attention_layers()`, or [(None, model)] for a bare layer."""
    if hasattr(model, "attention_layers"):
        return list(enumerate(model.attention_layers()))
    if hasattr(model, "hook_fns"):
        return [(None, model)]
    raise TypeError(f"{type(model).__name__} has no attention layers (no attention_layers() and no hook points)")


def hook_names(model: nn.Module) -> list[str]:
    """Every hook point's name, layer by layer."""
    return [act_name(p, layer) for layer, _ in attention_layers(model) for p in POINTS]


def _points(model: nn.Module) -> dict[str, tuple[nn.Module, Hook]]:
    return {act_name(p, layer): (mod, Hook(act_name(p, layer), layer, p))
            for layer, mod in attention_layers(model) for p in POINTS}


def _matching(names: list[str], selector: NameFilter) -> list[str]:
    """The names a filter selects: None = all, a name, a list of names, or a predicate on the name."""
    if selector is None:
        return names
    if callable(selector):
        return [n for n in names if selector(n)]
    wanted = [selector] if isinstance(selector, str) else list(selector)
    unknown = [w for w in wanted if w not in names]
    if unknown:
        raise ValueError(f"unknown hook point {unknown[0]!r}; e.g. {names[0]!r} (mhalab.hooks.hook_names(model))")
    return [n for n in names if n in wanted]


def call_hooks(layer: nn.Module, point: str, x: Tensor) -> Tensor:
    """Run the functions attached to `layer`'s `point` on x, in order (called by the layer itself)."""
    for fn, hook in layer.hook_fns.get(point, ()):
        out = fn(x, hook)
        if out is not None:
            if out.shape != x.shape:
                raise ValueError(f"hook on {hook.name} returned shape {tuple(out.shape)}, expected {tuple(x.shape)}")
            x = out
    return x


@contextlib.contextmanager
def hooks(model: nn.Module, fwd_hooks: Iterable[tuple[str | Callable[[str], bool], HookFn]]) -> Iterator[nn.Module]:
    """Attach `(name or name predicate, fn)` pairs for the duration of the block; detached on exit, even after an
    error. Blocks nest: inner hooks run after outer ones."""
    points = _points(model)
    attached: list[tuple[nn.Module, str, tuple]] = []
    try:
        for selector, fn in fwd_hooks:
            names = _matching(list(points), selector)
            if not names:
                raise ValueError(f"no hook point matches {selector!r}")
            for name in names:
                layer, hook = points[name]
                entry = (fn, hook)
                layer.hook_fns.setdefault(hook.point, []).append(entry)
                attached.append((layer, hook.point, entry))
        yield model
    finally:
        for layer, point, entry in reversed(attached):
            fns = layer.hook_fns[point]
            fns.remove(entry)
            if not fns:
                del layer.hook_fns[point]  # nothing attached: the layer takes its plain path again


def reset_hooks(model: nn.Module) -> None:
    """Detach every hook of every layer (hooks() already detaches its own; for a notebook left in a bad state)."""
    for _, layer in attention_layers(model):
        layer.hook_fns.clear()


def run_with_hooks(model: nn.Module, *args: Any, fwd_hooks=(), **kwargs: Any) -> Any:
    """`model(*args, **kwargs)` with `fwd_hooks` attached for this one call."""
    with hooks(model, fwd_hooks):
        return model(*args, **kwargs)


# TransformerLens's other names of the attention hook points (its utils.get_act_name aliases)
TL_ALIASES = {"attn": "pattern", "attn_logits": "attn_scores", "query": "q", "key": "k", "value": "v"}


class ActivationCache(dict):
    """{hook name: tensor}, also indexed TransformerLens's way: cache["pattern", 0], cache["pattern", 0, "attn"]
    (TL's layer type: "attn" or "a", the only blocks with hook points here), TL's aliases ("attn" for "pattern",
    "attn_logits" for "attn_scores", "query"/"key"/"value") and negative layers (cache["z", -1] is the last layer)
    all name cache["blocks.0.attn.hook_pattern"] and its kin; a point seen several times in one call keeps the last.
    """

    def __getitem__(self, key: str | tuple) -> Tensor:
        if isinstance(key, tuple):
            key = self.name(*key)
        return super().__getitem__(key)

    def name(self, point: str, layer: int | None = None, layer_type: str | None = None) -> str:
        """The hook name of TL's index (point, layer[, layer_type])."""
        if layer_type not in (None, "attn", "a"):
            raise KeyError(f"layer type {layer_type!r}: mhalab's hook points are in the attention blocks only "
                           "(layer type 'attn' or 'a')")
        point = point.removeprefix("hook_")
        if layer is not None and layer < 0:
            layer += self.n_layers
        return act_name(TL_ALIASES.get(point, point), layer)

    @property
    def n_layers(self) -> int:
        return len({k.split(".")[1] for k in self if k.startswith("blocks.")})

    def stack(self, point: str) -> Tensor:
        """Every layer's tensor of `point` stacked on a new first dimension: (n_layers, ...)."""
        import torch

        return torch.stack([self[point, layer] for layer in range(self.n_layers)])


def caching_hooks(model: nn.Module, names_filter: NameFilter = None, detach: bool = True,
                  device: Any = None) -> tuple[ActivationCache, list[tuple[str, HookFn]]]:
    """(an empty cache, the hooks that fill it): for `hooks(model, ...)` blocks that do more than one call."""
    cache = ActivationCache()

    def keep(x: Tensor, hook: Hook) -> None:
        x = x.detach() if detach else x
        cache[hook.name] = x.to(device) if device is not None else x

    names = _matching(hook_names(model), names_filter or (lambda n: not n.endswith("hook_result")))
    return cache, [(name, keep) for name in names]


def run_with_cache(model: nn.Module, *args: Any, names_filter: NameFilter = None, detach: bool = True,
                   device: Any = None, **kwargs: Any) -> tuple[Any, ActivationCache]:
    """(model(*args, **kwargs), the cache of the hook points `names_filter` selects; by default every point but
    hook_result, which changes how the output is summed, as TransformerLens leaves it off unless asked). The cache
    hooks run after any hook already attached, so they see interventions."""
    cache, fwd = caching_hooks(model, names_filter, detach, device)
    with hooks(model, fwd):
        out = model(*args, **kwargs)
    return out, cache
