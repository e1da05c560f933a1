"""A single run launched with the config the preflight composed and checked (issue 26).

`hydra.main` composes a single run's config twice more before its job starts (once to learn the mode, once to run
it: about 0.1 s of CPU each) after mhalab's preflight composed and checked the very same config. `launch` runs the
job as `hydra.main`'s run does (hydra-core 1.3's `Hydra.run`), through Hydra's public API: Hydra initialized on the
same search path (`Composer`), Hydra's logging configured from the config, Hydra's callbacks
(`hydra.callbacks`) told of the run and the job, and `hydra.core.utils.run_job` writing `.hydra/` and calling the
task function. A job that raises ends the command as under `hydra.main`: Hydra logs the overrides, the exception
propagates (exit status 1; its whole traceback, where `hydra.main` kept only the job's frames). Multiruns and the
flags that only print stay with `hydra.main`.
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf


def launch(args: argparse.Namespace, cfg: DictConfig, task_function: Callable[[DictConfig], Any]) -> Any:
    """Run `task_function` on `cfg` (a single run's config as `Composer.run_config` composed it for `args`) as
    `hydra.main` would run it; returns the job's return value."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import configure_log, run_job
    from hydra.types import HydraContext, RunMode

    from mhalab.config.compose import Composer

    with Composer(args, task_function) as composer:
        configure_log(cfg.hydra.hydra_logging, cfg.hydra.verbose)
        if cfg.hydra.mode != RunMode.RUN:
            raise ValueError(f"launch runs a single run, not hydra.mode={cfg.hydra.mode}")
        callbacks = HydraCallbacks(cfg)
        callbacks.on_run_start(config=cfg, config_name=composer.config_name)
        ret = run_job(hydra_context=HydraContext(config_loader=GlobalHydra.instance().config_loader(),
                                                 callbacks=callbacks),
                      task_function=task_function, config=cfg, job_dir_key="hydra.run.dir", job_subdir_key=None,
                      configure_logging=True)
        callbacks.on_run_end(config=cfg, config_name=composer.config_name, job_return=ret)
        return ret.return_value  # a failed job's exception, logged by Hydra with its overrides, raised here


class HydraCallbacks:
    """The callbacks a config lists under `hydra.callbacks`, instantiated and told of each event as Hydra does
    (hydra-core 1.3: in order at a start, in reverse at an end; a callback that raises is a warning)."""

    def __init__(self, cfg: DictConfig) -> None:
        from hydra.utils import instantiate

        self.callbacks = [instantiate(params) for params in (OmegaConf.select(cfg, "hydra.callbacks") or {}).values()]

    def _notify(self, name: str, reverse: bool = False, **kwargs: Any) -> None:
        for c in reversed(self.callbacks) if reverse else self.callbacks:
            try:
                getattr(c, name)(**kwargs)
            except Exception as e:
                warnings.warn(f"Callback {type(c).__name__}.{name} raised {type(e).__name__}: {e}")

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._notify("on_run_start", config=config, **kwargs)

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._notify("on_run_end", reverse=True, config=config, **kwargs)

    def on_job_start(self, config: DictConfig, *, task_function: Callable, **kwargs: Any) -> None:
        self._notify("on_job_start", config=config, task_function=task_function, **kwargs)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        self._notify("on_job_end", reverse=True, config=config, job_return=job_return, **kwargs)
