"""What a config may make mhalab instantiate: an allow-list of classes, checked on every node of the composed
config (Hydra's own node included) before anything is instantiated.

Allowed: mhalab's own classes meant for configs (OWN_CLASSES); the Lightning loggers and callbacks named below; the Hydra launchers, sweepers and
Optuna samplers the project ships configs for; and, explicitly, your own code: `allowed_targets: [mypkg.]` in
your config admits every `_target_` under those prefixes. Never a function such as `torch.load`, and nothing that
Python's logging config (`()` factories, handler classes) or environment settings (`hydra.job.env_set`) could use
to run code.
"""

from __future__ import annotations

from typing import Any, Iterator

from omegaconf import DictConfig, ListConfig, OmegaConf

from mhalab.errors import ConfigError

_LIGHTNING = {
    "loggers": ("CSVLogger", "TensorBoardLogger", "WandbLogger", "MLFlowLogger", "CometLogger"),
    "loggers.csv_logs": ("CSVLogger",),
    "loggers.tensorboard": ("TensorBoardLogger",),
    "loggers.wandb": ("WandbLogger",),
    "loggers.mlflow": ("MLFlowLogger",),
    "callbacks": ("LearningRateMonitor", "RichProgressBar", "TQDMProgressBar", "EarlyStopping", "ModelSummary",
                  "RichModelSummary", "DeviceStatsMonitor", "Timer", "GradientAccumulationScheduler",
                  "StochasticWeightAveraging", "LearningRateFinder", "BatchSizeFinder"),
}
ALLOWED_CLASSES = frozenset(
    [f"lightning.pytorch.{module}.{name}" for module, names in _LIGHTNING.items() for name in names]
    + [f"pytorch_lightning.{module}.{name}" for module, names in _LIGHTNING.items() for name in names]
    + [
        "hydra._internal.core_plugins.basic_launcher.BasicLauncher",
        "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
        "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
        "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
        "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",
        "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper",
    ]
    + [f"optuna.samplers.{s}" for s in ("TPESampler", "RandomSampler", "CmaEsSampler", "NSGAIISampler",
                                         "GridSampler", "MOTPESampler", "QMCSampler")]
)
# mhalab's own classes meant to be named in a config (tests/test_targets.py checks each is a class)
OWN_CLASSES = frozenset({"mhalab.callbacks.HeadStatsCallback", "mhalab.callbacks.ProgressLog",
                         "mhalab.loggers.WandbLogger"})
_LOGGING_NODES = ("job_logging", "hydra_logging")


def check_config(cfg: DictConfig, allowed_prefixes: list[str] | tuple[str, ...] = ()) -> None:
    """Refuse the config if any node could make mhalab run code outside the allow-list.

    `allowed_prefixes`: the user's own `allowed_targets`. Raises ConfigError naming the key.
    """
    prefixes = _user_prefixes(allowed_prefixes)
    for key, target in _targets(cfg, ""):
        check_target(target, key, prefixes)
    hydra = cfg.get("hydra") if "hydra" in cfg else None
    if isinstance(hydra, DictConfig):
        for name in _LOGGING_NODES:
            if name in hydra:
                _check_logging(hydra[name], f"hydra.{name}")
        env_set = OmegaConf.select(hydra, "job.env_set", default=None)
        if env_set:
            raise ConfigError(f"hydra.job.env_set={OmegaConf.to_container(env_set)!r}: setting environment variables "
                              "from a config is refused (they can load code into child processes); set them in your "
                              "shell")


def check_target(target: Any, key: str, user_prefixes: tuple[str, ...] = ()) -> None:
    """One `_target_`: an allow-listed class, a class of mhalab's own, or under a prefix the user allowed."""
    if not isinstance(target, str) or not target:
        raise ConfigError(f"{key}={target!r}: a _target_ must name a class")
    if target in ALLOWED_CLASSES or target in OWN_CLASSES or target.startswith(user_prefixes):
        return
    raise ConfigError(f"{key}={target!r}: not an allowed class; allowed are mhalab's own classes, Lightning's "
                      "loggers and callbacks, the Hydra launcher and sweeper plugins (mhalab.targets), and what your "
                      "config allows with allowed_targets: [your_package.]")


def _user_prefixes(prefixes) -> tuple[str, ...]:
    out = []
    for p in prefixes or ():
        if not isinstance(p, str) or not p.endswith(".") or not p.strip("."):
            raise ConfigError(f"allowed_targets entry {p!r}: give a package prefix ending in a dot, e.g. 'mypkg.'")
        out.append(p)
    return tuple(out)


def _targets(node: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(key, value) of every `_target_` in the config, resolving only the `_target_` values themselves."""
    if isinstance(node, DictConfig):
        for key in node.keys():
            child_path = f"{path}.{key}" if path else str(key)
            if key == "_target_":
                try:
                    yield child_path, node[key]
                except Exception:  # noqa: BLE001 - an interpolation that cannot be resolved now
                    yield child_path, OmegaConf.to_container(node, resolve=False).get(key)
                continue
            child = node._get_node(key)
            if isinstance(child, (DictConfig, ListConfig)):
                yield from _targets(child, child_path)
    elif isinstance(node, ListConfig):
        for i, child in enumerate(node._iter_ex(resolve=False)):
            if isinstance(child, (DictConfig, ListConfig)):
                yield from _targets(child, f"{path}[{i}]")


def _check_logging(node: Any, path: str) -> None:
    """Python logging config: no `()` factories; handler, formatter and filter classes only from `logging`."""
    if isinstance(node, DictConfig):
        for key in node.keys():
            child_path = f"{path}.{key}"
            if key == "()":
                raise ConfigError(f"{child_path}: logging factories ('()') are refused in a config")
            if key == "class":
                value = OmegaConf.to_container(node, resolve=False).get(key)
                if not (isinstance(value, str) and value.startswith(("logging.", "colorlog."))):
                    raise ConfigError(f"{child_path}={value!r}: logging classes must come from the logging module")
            child = node._get_node(key)
            if isinstance(child, (DictConfig, ListConfig)):
                _check_logging(child, child_path)
