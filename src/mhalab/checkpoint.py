"""Loading checkpoints safely: `torch.load(weights_only=True)` only, so no pickled code from a file ever runs.

A checkpoint written by `mhalab.train` holds the model's EncoderConfig, objective and classes in its
hyperparameters; `load_module` rebuilds exactly that model and refuses, with one sentence, a file that is not a
checkpoint or whose weights do not fit the architecture its hyperparameters (or the caller) describe. The data
config lives beside it in the run directory: `load_run_config` reads it and `build_data` rebuilds the task.
"""

from __future__ import annotations

import json
import os
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


def run_dir_of(ckpt: str | Path) -> Path:
    """The training run directory of a checkpoint (<run_dir>/checkpoints/<file>.ckpt)."""
    ckpt = Path(ckpt).resolve()
    return ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent


def load_run_config(ckpt: str | Path, run_dir: str | Path | None = None) -> dict[str, Any]:
    """The resolved training config of the run that wrote `ckpt` (from summary.json, else .hydra/config.yaml)."""
    rd = Path(run_dir) if run_dir else run_dir_of(ckpt)
    summary = rd / "summary.json"
    if summary.is_file():
        s = json.loads(summary.read_text())
        if isinstance(s.get("config"), dict):
            return {**s["config"], "_summary": s}
    hydra_cfg = rd / ".hydra" / "config.yaml"
    if hydra_cfg.is_file():
        from omegaconf import OmegaConf

        os.environ.setdefault("MHALAB_ROOT", str(rd.parents[2]) if len(rd.parents) > 2 else os.getcwd())
        cfg = OmegaConf.load(hydra_cfg)
        out = {k: OmegaConf.to_container(cfg[k], resolve=True) for k in ("data", "model", "attention", "optim",
                                                                          "trainer") if k in cfg}
        out["seed"] = cfg.get("seed", 0)
        return out
    raise ConfigError(f"no summary.json or .hydra/config.yaml in {rd}: give --run-dir, the training run directory "
                      f"that holds the checkpoint's config")


def build_data(run_cfg: dict[str, Any], batch_size: int | None = None):
    """The run's datamodule, set up (tokenized cache reused)."""
    from mhalab.data import build_datamodule

    dm = build_datamodule(run_cfg["data"], batch_size=batch_size, seed=int(run_cfg.get("seed", 0)))
    dm.prepare_data()
    dm.setup("fit")
    return dm
