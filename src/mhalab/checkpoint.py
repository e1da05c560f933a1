"""Loading checkpoints safely: `torch.load(weights_only=True)` only, so no pickled code from a file ever runs.

A checkpoint written by `mhalab.train` holds the model's EncoderConfig, objective and classes in its
hyperparameters; `load_module` rebuilds exactly that model and refuses, with one sentence, a file that is not a
checkpoint or whose weights do not fit the architecture its hyperparameters (or the caller) describe.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

from mhalab.errors import ConfigError


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """The checkpoint dict, loaded with weights_only=True (tensors and plain Python values only)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"checkpoint {path} does not exist (give the path of a .ckpt file written by mhalab.train)")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"checkpoint {path} cannot be loaded safely (weights_only=True): {first}") from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "hyper_parameters" not in ckpt:
        raise ConfigError(f"checkpoint {path} is not an mhalab training checkpoint (no state_dict/hyper_parameters)")
    hp = ckpt["hyper_parameters"]
    if not isinstance(hp, dict) or "model_cfg" not in hp or "objective" not in hp:
        raise ConfigError(f"checkpoint {path} was not written by mhalab.train (hyperparameters lack model_cfg)")
    return ckpt


def load_module(path: str | Path, expect: dict[str, Any] | None = None):
    """An AttentionLitModule rebuilt from a checkpoint's hyperparameters, weights loaded strictly, in eval mode.

    expect: EncoderConfig fields the caller requires (e.g. {"n_heads": 8}); a mismatch is a ConfigError.
    """
    from mhalab.module import AttentionLitModule

    ckpt = load_checkpoint(path)
    hp = dict(ckpt["hyper_parameters"])
    for key, value in (expect or {}).items():
        if hp["model_cfg"].get(key) != value:
            raise ConfigError(f"checkpoint {path} has {key}={hp['model_cfg'].get(key)!r}, expected {value!r}: "
                              "pass a checkpoint of that architecture")
    hp.pop("_instantiator", None)
    module = AttentionLitModule(**{k: hp[k] for k in ("model_cfg", "objective", "n_classes", "optim", "pooling",
                                                       "tie_weights", "token_bytes") if k in hp})
    try:
        module.load_state_dict(ckpt["state_dict"], strict=True)
    except RuntimeError as e:
        raise ConfigError(f"checkpoint {path}: weights do not fit the architecture in its hyperparameters "
                          f"({str(e).splitlines()[0]})") from None
    return module.eval()
