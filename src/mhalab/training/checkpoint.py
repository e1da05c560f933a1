"""Checkpoints: written atomically, read safely, and the runs they belong to.

A checkpoint written by `mhalab.training.train` holds the resolved `Architecture` and the optimiser settings in its
hyperparameters. `load_module` reads it with `torch.load(weights_only=True)` (tensors and plain values only, so a
pickle that would run code is refused), checks the architecture and that the stored weights have exactly the
parameter count it implies *before* building the model (a forged `vocab_size=2e8` allocates nothing), then loads
the weights strictly. The run's data config comes from its `summary.json` (`mhalab.runs.summary`).
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from mhalab import faults
from mhalab.atomic import write_atomic
from mhalab.errors import ConfigError
from mhalab.architecture import Architecture
from mhalab.runs.summary import RunSummary, read_summary

KEYS = ("arch", "optim", "token_bytes")  # the AttentionLitModule arguments a checkpoint keeps


class AtomicCheckpointIO(TorchCheckpointIO):
    """torch.save, then `mhalab.atomic.write_atomic`: a kill at any moment leaves the old or the new checkpoint,
    never half of one (private to its owner, as before). Loading is always weights_only."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)  # serialise first: a failed write then raises OSError, not torch's own
        write_atomic(path, buffer.getvalue(), mode=0o600, before_replace=lambda: faults.point("checkpoint_write"))

    def load_checkpoint(self, path, map_location: Any | None = None, weights_only: bool | None = None):
        return super().load_checkpoint(path, map_location=map_location, weights_only=True)


def require_files(paths) -> None:
    """ConfigError naming the first checkpoint path that is not a file (analysis commands check all before work)."""
    for path in map(Path, paths):
        if not path.is_file():
            raise ConfigError(f"checkpoint {path} does not exist (give the path of a .ckpt file written by "
                              "mhalab.training.train)")


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """The checkpoint dict, loaded with weights_only=True, its hyperparameters checked."""
    path = Path(path)
    require_files([path])
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"checkpoint {path} cannot be loaded safely (weights_only=True): {first}") from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), dict) or \
            not isinstance(ckpt.get("hyper_parameters"), dict):
        raise ConfigError(f"checkpoint {path} is not an mhalab training checkpoint (no state_dict/hyper_parameters)")
    hp = ckpt["hyper_parameters"]
    if "arch" not in hp or "optim" not in hp:
        raise ConfigError(f"checkpoint {path} was not written by this mhalab (its hyperparameters lack arch and optim)")
    try:
        arch = Architecture.from_dict(hp["arch"])
    except (ConfigError, TypeError) as e:
        raise ConfigError(f"checkpoint {path} has an invalid architecture: {e}") from None
    _check_weights_fit(path, arch, ckpt["state_dict"])
    return ckpt


def _check_weights_fit(path: Path, arch: Architecture, state: dict) -> None:
    """The stored parameters must number exactly what the architecture implies (checked before building it)."""
    from mhalab.cost import encoder_params

    stored = sum(v.numel() for k, v in state.items() if isinstance(v, torch.Tensor) and k.startswith("model.")
                 and not (arch.model.tie_weights and k.endswith("lm_head.weight")))
    expected = encoder_params(arch)
    if stored != expected:
        raise ConfigError(f"checkpoint {path}: its weights hold {stored:,} parameters but its architecture implies "
                          f"{expected:,}; the file is damaged or was not written by mhalab.training.train")


def load_module(path: str | Path, expect: dict[str, Any] | None = None):
    """An AttentionLitModule rebuilt from a checkpoint, weights loaded strictly, in eval mode.

    expect: attention fields the caller requires (e.g. {"n_heads": 8}); a mismatch is a ConfigError.
    """
    from mhalab.training.module import AttentionLitModule

    ckpt = load_checkpoint(path)
    hp = ckpt["hyper_parameters"]
    for key, value in (expect or {}).items():
        if hp["arch"]["attention"].get(key) != value:
            raise ConfigError(f"checkpoint {path} has attention.{key}={hp['arch']['attention'].get(key)!r}, expected "
                              f"{value!r}: pass a checkpoint of that architecture")
    module = AttentionLitModule(**{k: hp[k] for k in KEYS if k in hp})
    try:
        module.load_state_dict(ckpt["state_dict"], strict=True)
    except RuntimeError as e:
        raise ConfigError(f"checkpoint {path}: weights do not fit the architecture in its hyperparameters "
                          f"({str(e).splitlines()[0]})") from None
    return module.eval()


def resume_from(run_dir: str | Path) -> Path:
    """<run_dir>/checkpoints/last.ckpt, for a resumed run, once it loads (`load_checkpoint`). A damaged one is one
    ConfigError naming it and the newest intact checkpoint beside it (by its step), which is offered, not used:
    continuing from an earlier step is not proven to end as the run would have."""
    from mhalab.runs.rundir import LAST

    last = Path(run_dir) / LAST
    try:
        load_checkpoint(last)
        return last
    except ConfigError as e:
        damage = str(e).removeprefix(f"checkpoint {last} ")
    intact = []
    for path in sorted(last.parent.glob("*.ckpt")):
        try:
            intact.append((int(load_checkpoint(path).get("global_step", -1)), path.name, path))
        except (ConfigError, TypeError, ValueError):
            continue
    offer = (f"the newest intact checkpoint is {max(intact)[2]} (step {max(intact)[0]}): to continue from it (the "
             f"steps after it are trained again), mv {last} {last}.damaged && cp {max(intact)[2]} {last}, then run "
             "the same command again" if intact else "no intact checkpoint is left beside it: start the run again "
             "without resume")
    raise ConfigError(f"cannot resume from {last}: it {damage}; {offer}")


def run_dir_of(ckpt: str | Path) -> Path:
    """The training run directory of a checkpoint (<run_dir>/checkpoints/<file>.ckpt)."""
    ckpt = Path(ckpt).resolve()
    return ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent


def load_run(ckpt: str | Path, run_dir: str | Path | None = None) -> tuple[Path, RunSummary]:
    """(run directory, its RunSummary) of the run that wrote `ckpt`."""
    rd = Path(run_dir) if run_dir else run_dir_of(ckpt)
    return rd, read_summary(rd)


def build_data(summary: RunSummary, batch_size: int | None = None, where: str = "summary.json"):
    """The run's datamodule, set up (its tokenized cache reused), from its summary (`where`), which anyone may have
    written: a built-in task is rebuilt from its name and settings; a `data.source` class passes the allow-list and
    this command's grants (`DataConfig.task_object`); the cache is the file's only where that is an existing mhalab
    cache (else this command's own, `paths.cache_dir`'s default), the Hugging Face cache always this command's."""
    from mhalab.data import build_datamodule

    data = dict(summary.config.get("data") or {})
    cache = data.get("cache_dir")
    if not (isinstance(cache, str) and os.path.isabs(cache) and Path(cache, "mhalab_data").is_dir()
            and not Path(cache, "mhalab_data").is_symlink()):
        data["cache_dir"] = os.path.join(os.environ.get("MHALAB_ROOT") or os.getcwd(), ".cache", "mhalab")
    data["hf_cache_dir"] = None
    try:
        dm = build_datamodule(data, batch_size=batch_size, seed=int(summary.config.get("seed", 0)))
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    dm.prepare_data()
    dm.setup("fit")
    return dm
