"""Training entry point: `python -m mhalab.train [overrides]` or `mhalab-train [overrides]`.

Composes conf/train.yaml, validates it, seeds everything, builds the data task and the model, trains with
Lightning, tests the best checkpoint, and writes <run_dir>/summary.json (config, metrics, timings, cost figures,
per-head statistics) so results can be read back without any tracker.

Exit status: 0 on success; 2 for a config or input error (one sentence on stderr, no run directory left behind);
1 when training fails (e.g. a NaN loss; summary.json then says "failed" and why). In a multirun a failing job
records its failure in its own summary.json and the sweep goes on.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import secrets
import shutil
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from mhalab.errors import ConfigError

log = logging.getLogger("mhalab.train")
CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")


def new_run_id() -> str:
    """Time to the microsecond, process id and random bits: unique even for jobs started in the same second."""
    return f"{datetime.now():%Y-%m-%d_%H-%M-%S_%f}_{os.getpid()}_{secrets.token_hex(2)}"


def write_json(path: Path, data: dict) -> None:
    """Write JSON atomically (temporary file, then rename): a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_finite(data), indent=2, default=_jsonable, allow_nan=False))
    os.replace(tmp, path)


def _finite(x: Any) -> Any:
    """NaN and inf become None (JSON has no NaN)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _jsonable(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, Path):
        return str(x)
    return str(x)


def print_config(cfg: DictConfig) -> None:
    from rich.console import Console
    from rich.syntax import Syntax
    from rich.tree import Tree

    tree = Tree("config", guide_style="dim")
    for key, node in cfg.items():
        text = OmegaConf.to_yaml(node, resolve=True) if isinstance(node, DictConfig) else str(node)
        tree.add(str(key)).add(Syntax(text, "yaml", theme="ansi_dark", background_color="default"))
    Console(stderr=False).print(tree)


def build_loggers_and_callbacks(cfg: DictConfig):
    """The configured loggers and callbacks, `_target_` checked; no progress bar when the trainer shows none."""
    from mhalab.config import instantiate_safe

    loggers = [instantiate_safe(node, f"logger.{name}") for name, node in (cfg.get("logger") or {}).items()
               if node is not None]
    callbacks = []
    for name, node in (cfg.get("callbacks") or {}).items():
        if node is None or (name == "rich_progress_bar" and not cfg.trainer.get("enable_progress_bar", True)):
            continue
        callbacks.append(instantiate_safe(node, f"callbacks.{name}"))
    return loggers, callbacks


def train(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Everything after validation; returns the summary (also written to run_dir/summary.json)."""
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    from mhalab.callbacks import HeadStatsCallback
    from mhalab.config import encoder_config
    from mhalab.cost import model_cost
    from mhalab.data import build_datamodule
    from mhalab.module import AttentionLitModule
    from mhalab.runs import LAST, AtomicCheckpointIO, StepSeed, FaultInjection, wandb_run_id

    t_start = time.perf_counter()
    if cfg.get("torch_threads"):
        torch.set_num_threads(int(cfg.torch_threads))
    L.seed_everything(cfg.seed, workers=True)

    dm = build_datamodule(cfg.data, seed=cfg.seed)
    dm.prepare_data()
    dm.setup("fit")
    enc = encoder_config(cfg, dm.vocab_size, dm.causal)
    if dm.max_len > enc.max_len:
        raise ConfigError(f"data.max_len={dm.max_len} is longer than the positional table model.max_len={enc.max_len}: "
                          "raise model.max_len or lower data.max_len")
    module = AttentionLitModule(enc.to_dict(), dm.objective, dm.n_classes, OmegaConf.to_container(cfg.optim),
                                pooling=cfg.model.get("pooling", "cls"), tie_weights=cfg.model.get("tie_weights", True),
                                token_bytes=dm.token_bytes.tolist() if dm.token_bytes is not None else None)
    cost = model_cost(enc, dm.max_len, dm.objective, dm.n_classes or 2)
    log.info("model: %s parameters, %.3g forward FLOPs/token at n=%d, KV cache %d bytes/token",
             f"{cost['params']:,}", cost["flops_per_token"], dm.max_len, cost["kv_cache_bytes_per_token"])

    ckpt_path = cfg.get("ckpt_path")
    if cfg.get("resume") and (run_dir / LAST).is_file():
        ckpt_path = str(run_dir / LAST)
        log.info("resuming from %s", ckpt_path)
        if cfg.get("logger") and cfg.logger.get("wandb") and wandb_run_id(run_dir):
            cfg.logger.wandb.id = wandb_run_id(run_dir)  # continue the same wandb run
        if cfg.get("logger") and cfg.logger.get("csv"):  # keep the metrics written before the crash
            cfg.logger.csv.version = f"resumed-{len(list(run_dir.glob('csv/resumed-*'))) + 1}"
    loggers, callbacks = build_loggers_and_callbacks(cfg)
    callbacks.append(StepSeed(cfg.seed))
    if cfg.get("fault") and any(v is not None for v in cfg.fault.values()):
        callbacks.append(FaultInjection(**cfg.fault))
    stats_cb = None
    if cfg.get("stats") and cfg.stats.enabled:
        stats_cb = HeadStatsCallback(dm.probe_batch(cfg.stats.probe_size), every_n_steps=cfg.stats.every_n_steps,
                                     importance=cfg.stats.importance, importance_batches=cfg.stats.importance_batches,
                                     plots=cfg.stats.plots, plot_dir=run_dir / "plots", decode=dm.decode,
                                     max_plot_tokens=cfg.stats.max_plot_tokens)
        callbacks.append(stats_cb)
    hparams = {"config": OmegaConf.to_container(cfg, resolve=True), "cost": cost, "task": dm.task,
               "objective": dm.objective, "vocab_size": dm.vocab_size, "n_classes": dm.n_classes}
    for logger in loggers:
        logger.log_hyperparams(hparams)

    trainer = L.Trainer(**OmegaConf.to_container(cfg.trainer, resolve=True), callbacks=callbacks,
                        logger=loggers or False, plugins=[AtomicCheckpointIO()])
    t_fit = time.perf_counter()
    if cfg.get("train", True):
        trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path, weights_only=True)
    fit_s = time.perf_counter() - t_fit
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}

    t_test = time.perf_counter()
    test_metrics: dict[str, float] = {}
    ckpt_cb = next((c for c in trainer.callbacks if isinstance(c, ModelCheckpoint)), None)
    best = ckpt_cb.best_model_path if ckpt_cb is not None and ckpt_cb.best_model_path else None
    if cfg.get("test", True):
        results = trainer.test(module, datamodule=dm, ckpt_path=best, weights_only=True) if best else \
            trainer.test(module, datamodule=dm)
        test_metrics = {k: float(v) for k, v in (results[0] if results else {}).items()}
    test_s = time.perf_counter() - t_test

    summary = {
        "status": "ok",
        "run_dir": str(run_dir),
        "task": dm.task,
        "objective": dm.objective,
        "overrides": list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else [],
        "config": OmegaConf.to_container(cfg, resolve=True),
        "metrics": metrics,
        "test_metrics": test_metrics,
        "cost": cost,
        "timings": {
            "fit_s": fit_s, "test_s": test_s, "total_s": time.perf_counter() - t_start,
            "train_steps": trainer.global_step, "epochs": trainer.current_epoch,
            "tokens_seen": module.tokens_seen, "tokens_per_s": module.tokens_seen / fit_s if fit_s > 0 else None,
        },
        "checkpoints": {"best": best, "last": ckpt_cb.last_model_path if ckpt_cb is not None else None},
        "head_stats": stats_cb.table if stats_cb else {},
        "head_importance": stats_cb.importance_table if stats_cb else {},
        "kv_groups": stats_cb.groups if stats_cb else {},
        "plots": stats_cb.plot_paths if stats_cb else [],
        "environment": {"torch": torch.__version__, "lightning": L.__version__, "python": platform.python_version(),
                        "machine": platform.machine(), "cpu_count": os.cpu_count(),
                        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                        "torch_threads": torch.get_num_threads()},
    }
    if trainer.is_global_zero:
        write_json(run_dir / "summary.json", summary)
    return summary


def _looks_empty(run_dir: Path) -> bool:
    """Only Hydra's bookkeeping (.hydra/, the job log) and nothing a run produced."""
    return run_dir.is_dir() and all(p.name == ".hydra" or p.suffix == ".log" for p in run_dir.iterdir())


def run(cfg: DictConfig) -> float | None:
    """One job: validate, train, summarise; failures handled as the module docstring says."""
    from mhalab.config import validate

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    try:
        validate(cfg)
        print_config(cfg)
        summary = train(cfg, run_dir)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        if multirun:  # keep the job's directory so the sweep report lists it as failed
            write_json(run_dir / "summary.json", {"status": "failed", "error": str(e), "kind": "config",
                                                  "overrides": list(hc.overrides.task)})
            return None
        if _looks_empty(run_dir):
            shutil.rmtree(run_dir, ignore_errors=True)
        sys.exit(2)
    except OSError as e:  # disk full, unwritable directory, file too large
        print(f"error: could not write {e.filename or 'a file'} ({e.strerror or e}); free space or set "
              "paths.log_dir to a writable directory with room", file=sys.stderr)
        if multirun:
            return None
        sys.exit(1)
    except FloatingPointError as e:
        print(f"error: training stopped: {e}; the last good checkpoint is kept in {run_dir / 'checkpoints'}",
              file=sys.stderr)
        write_json(run_dir / "summary.json", {"status": "failed", "error": str(e), "kind": "nan",
                                              "overrides": list(hc.overrides.task)})
        if multirun:
            return None
        sys.exit(1)
    finally:
        _finish_wandb()
    print(result_line(summary))
    return summary["metrics"].get("val/loss")


def result_line(summary: dict) -> str:
    """One line to end a run with: the headline metrics, the time, and where everything is."""
    keys = ("val/acc", "val/bpb", "val/loss", "test/acc", "test/bpb")
    found = {k: v for k, v in {**summary["metrics"], **summary["test_metrics"]}.items() if k in keys}
    metrics = ", ".join(f"{k} {found[k]:.4f}" for k in keys if k in found)
    return f"mhalab: done in {summary['timings']['total_s']:.0f} s: {metrics}; results in {summary['run_dir']}/summary.json"


def _finish_wandb() -> None:
    """Close any wandb run (also after an error, and between multirun jobs)."""
    if "wandb" in sys.modules:
        import wandb

        if wandb.run is not None:
            wandb.finish()


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
def _hydra_main(cfg: DictConfig) -> float | None:
    return run(cfg)


def main() -> None:
    from mhalab.runs import preflight

    os.environ.setdefault("MHALAB_RUN_ID", new_run_id())
    os.environ.setdefault("MHALAB_ROOT", os.getcwd())
    try:
        sys.argv[1:] = preflight(sys.argv[1:], CONF_DIR)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    _hydra_main()


if __name__ == "__main__":
    main()
