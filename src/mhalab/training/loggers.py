"""Loggers mhalab adds to Lightning's: `WandbLogger`, Lightning's own without its noise."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.loggers.wandb import WandbLogger as _LightningWandbLogger


class WandbLogger(_LightningWandbLogger):
    """Lightning's WandbLogger, quiet: it does not pass wandb the deprecated `anonymous` setting (wandb warns on
    every run), and wandb's banner, sync hints and end-of-run sparklines are off unless `quiet=false`. The run's
    folder is in the run directory; `wandb sync <run_dir>/wandb/offline-run-*` uploads an offline run."""

    def __init__(self, *args: Any, quiet: bool = True, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if self._wandb_init.get("anonymous") is None:
            self._wandb_init.pop("anonymous", None)
        settings = dict(self._wandb_init.get("settings") or {})
        settings.setdefault("quiet", quiet)
        settings.setdefault("x_disable_stats", True)  # no system-metrics thread sampling the machine
        self._wandb_init["settings"] = settings
