"""A grid sweep whose jobs are composed once (issue 26): `hydra/sweeper=grid`, mhalab's default sweeper.

Hydra's basic sweeper composes every job to check it (`Sweeper.validate_batch_is_legal`), then its launcher composes
it again to run it, after mhalab's preflight composed and checked it before anything was written: three compositions
of each job, about 0.09 s of CPU each. `GridSweeper` expands the grid as the basic sweeper does (the same jobs in the
same order, `hydra.sweeper.params` and `max_batch_size` alike) and hands its launcher, through Hydra's public plugin
APIs, a config loader (`HandedConfigs`) that gives each job the config the preflight composed for it
(`hand_on`), composed with the very overrides the launcher asks for. A job the preflight did not compose (another
command line, a resumed sweep's new directory, a job past HAND_ON_MAX) is composed by the sweeper, once, as the basic
sweeper checks it, and handed on too: so a batch is still checked before its first job runs.

The handed configs live in this process only: a launcher that runs jobs in other processes (joblib's workers,
submitit's jobs) pickles an empty store and composes each job there, as before.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

from hydra.core.config_loader import ConfigLoader
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, RunMode, TaskFunction
from omegaconf import DictConfig, OmegaConf

from mhalab.errors import ConfigError

log = logging.getLogger(__name__)
GRID_SWEEPERS = (".BasicSweeper", ".GridSweeper")  # `_target_` endings of the sweepers that run a grid
HAND_ON_MAX = 256  # jobs whose composed configs are kept for the launcher (under 1 MB each)
_HANDED: dict[tuple, DictConfig] = {}


def is_grid(sweeper_target: str) -> bool:
    """Whether a sweeper (`hydra.sweeper._target_`) runs the grid of its overrides: Hydra's basic one or this one."""
    return str(sweeper_target).endswith(GRID_SWEEPERS)


def takes_handed(sweeper_target: str) -> bool:
    """Whether a sweeper's launcher takes the configs the preflight hands on: this one's (`GridSweeper`)."""
    return str(sweeper_target).endswith(GRID_SWEEPERS[-1])


def check_batch_size(size) -> None:
    """hydra.sweeper.max_batch_size: null or -1 (every job in one batch) or a positive number of jobs (the preflight
    checks it before anything is written; the sweeper holds to it)."""
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or not (size == -1 or size > 0)):
        raise ConfigError(f"hydra.sweeper.max_batch_size={size!r}: give null or -1 (all jobs in one batch) or a "
                          "positive number of jobs a batch")


def _key(config_name: str | None, overrides: Sequence[str]) -> tuple:
    return config_name, tuple(overrides)


def hand_on(config_name: str | None, overrides: Sequence[str], cfg: DictConfig) -> None:
    """Keep `cfg`, composed by `hydra.compose(config_name, overrides, return_hydra_config=True)`, for the launcher
    that composes these overrides (Hydra's `load_sweep_config`: the master's Hydra overrides, then the job's)."""
    if len(_HANDED) < HAND_ON_MAX:
        _HANDED[_key(config_name, overrides)] = cfg


def forget() -> None:
    """Drop every config kept for a launcher (a new command)."""
    _HANDED.clear()


def handed() -> int:
    """How many composed configs wait for a launcher."""
    return len(_HANDED)


class HandedConfigs(ConfigLoader):
    """Hydra's config loader, except that a sweep job composed before is taken from `hand_on`'s store (each once)
    instead of composed again. Pickled (for a launcher's other processes) without the store."""

    def __init__(self, loader: ConfigLoader) -> None:
        self.loader = loader
        self.local = True

    def __getstate__(self) -> dict:
        return {"loader": self.loader, "local": False}

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        # Hydra's ConfigLoaderImpl.load_sweep_config composes exactly these overrides under this config name
        overrides = list(OmegaConf.to_container(master_config.hydra.overrides.hydra)) + list(sweep_overrides)
        cfg = _HANDED.pop(_key(master_config.hydra.job.config_name, overrides), None) if self.local else None
        if cfg is None:
            return self.loader.load_sweep_config(master_config, sweep_overrides)
        OmegaConf.copy_cache(from_config=master_config, to_config=cfg)  # as load_sweep_config does
        return cfg

    def load_configuration(self, *args: Any, **kwargs: Any) -> DictConfig:
        return self.loader.load_configuration(*args, **kwargs)

    def get_search_path(self) -> Any:
        return self.loader.get_search_path()

    def get_sources(self) -> Any:
        return self.loader.get_sources()

    def list_groups(self, parent_name: str) -> Any:
        return self.loader.list_groups(parent_name)

    def get_group_options(self, *args: Any, **kwargs: Any) -> Any:
        return self.loader.get_group_options(*args, **kwargs)

    def compute_defaults_list(self, *args: Any, **kwargs: Any) -> Any:
        return self.loader.compute_defaults_list(*args, **kwargs)


class GridSweeper(Sweeper):
    """Hydra's basic grid sweep (every combination of `hydra.sweeper.params` and the command line's sweeps, the
    first key slowest, in batches of `max_batch_size`), each job composed once."""

    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None) -> None:
        super().__init__()
        self.max_batch_size, self.params = max_batch_size, dict(params or {})
        self.hydra_context: HydraContext | None = None
        self.config: DictConfig | None = None
        self.launcher = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        loader = HandedConfigs(hydra_context.config_loader)
        self.hydra_context = HydraContext(config_loader=loader, callbacks=hydra_context.callbacks)
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=self.hydra_context,
                                                                task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        from mhalab.config.compose import grid

        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        jobs = grid([f"{k}={v}" for k, v in self.params.items()] + list(arguments))
        check_batch_size(self.max_batch_size)
        size = len(jobs) if self.max_batch_size in (None, -1) else self.max_batch_size
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        returns, first = [], 0
        for start in range(0, len(jobs), size):
            batch = jobs[start:start + size]
            self._compose_missing(batch)  # a batch is checked before its first job runs, as the basic sweeper does
            results = self.launcher.launch(batch, initial_job_idx=first)
            for r in results:
                _ = r.return_value  # a failed job raises here, as with the basic sweeper
            first += len(batch)
            returns.append(results)
        return returns

    def _compose_missing(self, batch: list[list[str]]) -> None:
        loader = self.hydra_context.config_loader.loader
        hydra = list(OmegaConf.to_container(self.config.hydra.overrides.hydra))
        name = self.config.hydra.job.config_name
        for job in batch:
            if _key(name, hydra + list(job)) not in _HANDED:
                cfg = loader.load_configuration(config_name=name, overrides=hydra + list(job), run_mode=RunMode.RUN)
                hand_on(name, hydra + list(job), cfg)
