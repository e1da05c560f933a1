"""What a config may make mhalab run: an allow-list of classes, and grants that only the person running the command
can give.

Allowed without a grant: mhalab's classes meant for configs (OWN_CLASSES), the Lightning loggers and callbacks,
Hydra launchers and sweepers and Optuna samplers named in ALLOWED_CLASSES, by their exact names. Your own code
needs a grant on the command line (`mhalab train --allow mypkg`) or in the environment (`MHALAB_ALLOW=mypkg`),
never from a config: a `_target_` under a granted package must then resolve to a class whose own module is inside
that package (so `mypkg.torch.load`, a re-exported function, and `mypkg.np.ndarray`, someone else's class, are
refused). A `_target_` must be a literal name (no interpolation). Python logging config may only use the
handler and formatter classes below (no factories, no `ext://` imports), environment settings
(`hydra.job.env_set`) and shell lines for SLURM (`hydra.launcher.setup`) are refused, and a function a plugin calls
(`hydra.sweeper.custom_search_space`) must be defined in a granted package.

Interpolations may only refer to config nodes and call the resolvers in ALLOWED_RESOLVERS with plain arguments:
`${oc.create:...}`, `${oc.decode:...}` and dict or list literals inside an interpolation are refused, since they
make config nodes (a `{_target_: ...}` among them) that exist only once the config is resolved. The resolved config
is checked again (`check_resolved`): its targets, and no text in it that is still an interpolation (an
escaped `\\${...}` resolves to `${...}`, which building a logger or callback would resolve again).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from typing import Any, Iterator

from omegaconf import DictConfig, ListConfig, OmegaConf

from mhalab.checks import walk
from mhalab.errors import ConfigError

GRANT_ENV = "MHALAB_ALLOW"
_LIGHTNING = {
    "loggers": ("CSVLogger", "TensorBoardLogger", "WandbLogger"),
    "loggers.csv_logs": ("CSVLogger",),
    "loggers.tensorboard": ("TensorBoardLogger",),
    "loggers.wandb": ("WandbLogger",),
    "callbacks": ("LearningRateMonitor", "RichProgressBar", "TQDMProgressBar", "EarlyStopping", "ModelSummary",
                  "RichModelSummary", "DeviceStatsMonitor", "Timer", "GradientAccumulationScheduler",
                  "StochasticWeightAveraging"),
}
ALLOWED_CLASSES = frozenset(
    [f"lightning.pytorch.{module}.{name}" for module, names in _LIGHTNING.items() for name in names]
    + [f"pytorch_lightning.{module}.{name}" for module, names in _LIGHTNING.items() for name in names]
    + [
        "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
        "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
        "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",
        "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper",
    ]
    + [f"optuna.samplers.{s}" for s in ("TPESampler", "RandomSampler", "CmaEsSampler", "NSGAIISampler",
                                         "GridSampler", "MOTPESampler", "QMCSampler")]
)
# mhalab's own classes meant to be named in a config (tests/config/test_targets.py checks each is a class)
OWN_CLASSES = frozenset({"mhalab.training.callbacks.HeadStatsCallback", "mhalab.training.callbacks.ProgressLog",
                         "mhalab.training.loggers.WandbLogger", "hydra_plugins.mhalab_sweeper.GridSweeper"})
LOGGING_CLASSES = {
    "handlers": ("logging.StreamHandler", "logging.FileHandler", "logging.NullHandler",
                 "logging.handlers.RotatingFileHandler", "logging.handlers.TimedRotatingFileHandler",
                 "logging.handlers.WatchedFileHandler"),
    "formatters": ("logging.Formatter", "colorlog.ColoredFormatter"),
}
LOGGING_STREAMS = ("ext://sys.stdout", "ext://sys.stderr")
# resolvers an interpolation may call: none of them turns text into config nodes (oc.create and oc.decode do)
ALLOWED_RESOLVERS = ("oc.env", "oc.select", "oc.dict.keys", "oc.dict.values", "oc.deprecated", "now", "hydra",
                     "mhalab.cwd", "mhalab.run_id", "mhalab.direction")
# SLURM options a config may pass to sbatch (hydra.launcher.additional_parameters): none of them runs a program
SBATCH_OPTIONS = ("constraint", "exclusive", "mail_type", "mail_user", "reservation", "gres", "hint", "wckey",
                  "requeue", "nice", "licenses", "exclude", "nodelist", "time_min", "mem_per_gpu", "comment")


# -- grants: from the command line or the environment, never from a config -------------------------------------

def granted() -> tuple[str, ...]:
    """The packages whose classes configs may name: MHALAB_ALLOW (comma-separated), which `grant` extends."""
    return tuple(p for p in os.environ.get(GRANT_ENV, "").replace(" ", "").split(",") if p)


def grant(packages: list[str]) -> None:
    """Grant these top-level packages (from `--allow`), for this process and the job processes it starts."""
    names = []
    for p in list(granted()) + list(packages):
        name = p.strip().rstrip(".")
        if not name.isidentifier():
            raise ConfigError(f"--allow {p!r}: give a top-level package name, e.g. --allow mytasks")
        if not grantable(name):
            raise ConfigError(f"--allow {p!r}: only your own packages can be granted, not the standard library, "
                              "mhalab or its dependencies")
        if name not in names:
            names.append(name)
    os.environ[GRANT_ENV] = ",".join(names)


def grantable(package: str) -> bool:
    """Only your own packages can be granted: not the standard library, mhalab or its core dependencies."""
    return package not in sys.stdlib_module_names and package not in (
        "mhalab", "hydra", "hydra_plugins", "omegaconf", "torch", "lightning", "pytorch_lightning")


def split_allow(argv: list[str]) -> tuple[list[str], list[str]]:
    """(packages from `--allow PKG[,PKG]` / `--allow=PKG`, the other arguments)."""
    packages, rest, i = [], [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--allow":
            if i + 1 >= len(argv):
                raise ConfigError("--allow needs a package name, e.g. --allow mytasks")
            packages += argv[i + 1].split(",")
            i += 2
            continue
        if a.startswith("--allow="):
            packages += a.split("=", 1)[1].split(",")
        else:
            rest.append(a)
        i += 1
    return packages, rest


def check_no_grant_in_config(cfg: DictConfig, files: list[str]) -> None:
    """`allowed_targets` (the old way to grant) is refused wherever it is set, naming the file that set it."""
    node = cfg._get_node("allowed_targets") if "allowed_targets" in cfg else None
    value = OmegaConf.to_container(node, resolve=False) if isinstance(node, ListConfig) else \
        (node._value() if node is not None else None)
    if value:
        where = f"the config file {', '.join(files)}" if files else "the command line"
        raise ConfigError(f"allowed_targets={value!r} set in {where} is refused: what may run is granted only by "
                          "the person running the command, with --allow PACKAGE or MHALAB_ALLOW=PACKAGE")


# -- the config ----------------------------------------------------------------------------------------------------

def check_config(cfg: DictConfig) -> None:
    """Refuse the config if any node could make mhalab, Hydra or a plugin run code outside the allow-list and the
    grants. Raises ConfigError naming the key."""
    found = list(_interpolations(cfg, ""))
    for key, text in sorted(found, key=lambda kt: kt[0].startswith("hydra.")):  # the config's own keys first
        check_interpolation(text, key)
    for key, target in _targets(cfg, ""):
        check_target(target, key)
    hydra = cfg.get("hydra") if "hydra" in cfg else None
    if not isinstance(hydra, DictConfig):
        return
    for name in ("job_logging", "hydra_logging"):
        if name in hydra and hydra[name] is not None:
            check_logging(OmegaConf.to_container(hydra[name], resolve=False), f"hydra.{name}")
    env = OmegaConf.to_container(hydra.job, resolve=False).get("env_set") if "job" in hydra else None
    copied = OmegaConf.select(hydra, "job.env_copy", default=None) or []
    if env and any(k not in copied or os.environ.get(k) != v for k, v in env.items()):
        raise ConfigError(f"hydra.job.env_set={env!r}: setting environment variables from a config is refused "
                          "(they can load code into child processes); set them in your shell")
    launcher = OmegaConf.to_container(hydra.launcher, resolve=False) if "launcher" in hydra else {}
    for key in ("setup", "srun_args"):
        if (launcher or {}).get(key):
            raise ConfigError(f"hydra.launcher.{key}={launcher[key]!r}: shell lines for SLURM jobs are refused in "
                              "a config; prepare the environment in your shell or sbatch defaults")
    for option in ((launcher or {}).get("additional_parameters") or {}):
        if str(option).replace("-", "_") not in SBATCH_OPTIONS:
            raise ConfigError(f"hydra.launcher.additional_parameters.{option}: not an sbatch option a config may "
                              f"set; allowed are {', '.join(SBATCH_OPTIONS)}")
    space = OmegaConf.select(hydra, "sweeper.custom_search_space", default=None, throw_on_resolution_failure=False)
    if space is not None:
        check_callable(space, "hydra.sweeper.custom_search_space")


def check_resolved(plain: Any, path: str = "") -> None:
    """Every `_target_` of the config resolved as the job will see it (plain data) is allowed, wherever it came
    from."""
    for key, value in walk(plain, path):
        if key == "_target_" or key.endswith("._target_"):
            check_target(value, key)
        elif isinstance(value, str) and "${" in value:  # an escaped `\${...}` resolves to this text
            raise ConfigError(f"{key}={value!r}: a value that is an interpolation once resolved is refused (building "
                              "a logger, callback or plugin from it would resolve it again, unchecked); write it "
                              "without `\\${`")


def check_launcher_text(launcher: Any, path: str = "hydra.launcher") -> None:
    """The launcher's settings, resolved: no line breaks or other control characters in any of them, since a
    SLURM launcher writes each as a `#SBATCH --key='value'` line of a shell script (a quoted line break ends the
    comment and the next line runs as a command)."""
    for key, value in walk(launcher, path):
        if isinstance(value, str) and any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise ConfigError(f"{key}={value!r}: a line break or control character in a launcher setting is "
                              "refused (it would become a line of the job's batch script)")


def check_interpolation(text: str, key: str) -> None:
    """One interpolation (`${...}` anywhere in a string): only ALLOWED_RESOLVERS, named literally, and no dict or
    list literal, so resolving it can only give text, numbers or nodes already in the config."""
    for kind, what in _grammar(text):
        if kind == "resolver" and what not in ALLOWED_RESOLVERS:
            raise ConfigError(f"{key}={text!r}: the resolver {what!r} is refused in a config (it could make config "
                              f"nodes that are not checked); interpolations may use {', '.join(ALLOWED_RESOLVERS)}")
        if kind == "container":
            raise ConfigError(f"{key}={text!r}: a dict or list written inside an interpolation ({what}) is refused "
                              "(it would become a config node that is not checked); write it as a config node and "
                              "refer to it with ${path}")


@functools.lru_cache(maxsize=4096)
def _grammar(text: str) -> tuple[tuple[str, str], ...]:
    """('resolver', name) for each resolver call and ('container', text) for each dict or list literal inside an
    interpolation of `text`, as OmegaConf's grammar parses it."""
    from omegaconf import grammar_parser
    from omegaconf.grammar.gen.OmegaConfGrammarParser import OmegaConfGrammarParser as G

    try:
        tree = grammar_parser.parse(text)
    except Exception as e:  # noqa: BLE001 - OmegaConf's grammar error: the value cannot be resolved at all
        return (("resolver", f"<unparsable: {str(e).splitlines()[0] if str(e) else type(e).__name__}>"),)
    found, stack = [], [(tree, False)]
    while stack:
        node, inside = stack.pop()
        if isinstance(node, G.ResolverNameContext):
            found.append(("resolver", node.getText()))
            continue
        if inside and isinstance(node, (G.DictContainerContext, G.ListContainerContext)):
            found.append(("container", node.getText()))
        inside = inside or isinstance(node, G.InterpolationContext)
        stack += [(c, inside) for c in reversed(getattr(node, "children", None) or [])]
    return tuple(found)


def hydra_basic(group: str) -> str:
    """The `_target_` of Hydra's own plugin of `group` ("launcher", "sweeper"), as Hydra's config store names it."""
    from hydra.core.config_store import ConfigStore
    from hydra.core.plugins import Plugins

    Plugins.instance()  # Hydra's core plugins store their configs as they are imported
    return ConfigStore.instance().load(f"hydra/{group}/basic.yaml").node._target_


@functools.cache
def _hydra_basic() -> tuple[str, str]:
    """Hydra's own launcher and sweeper, allowed by the names Hydra gives them."""
    return hydra_basic("launcher"), hydra_basic("sweeper")


def check_target(target: Any, key: str) -> None:
    """One `_target_`: an allow-listed class by its exact name, or a class defined inside a granted package."""
    if not isinstance(target, str) or not target or "${" in target:
        raise ConfigError(f"{key}={target!r}: a _target_ must name a class literally")
    if target in ALLOWED_CLASSES or target in OWN_CLASSES or target in _hydra_basic():
        return
    obj = _resolve(target, key)
    if not inspect.isclass(obj):
        raise ConfigError(f"{key}={target!r}: {_what(obj)}, not a class; only classes may be named")


def check_callable(path: Any, key: str) -> None:
    """A function a plugin calls by name: defined inside a granted package."""
    if not isinstance(path, str) or not path or "${" in path:
        raise ConfigError(f"{key}={path!r}: must name a function of a granted package literally")
    obj = _resolve(path, key)
    if not (inspect.isfunction(obj) or inspect.isclass(obj)):
        raise ConfigError(f"{key}={path!r}: {_what(obj)}, not a function of yours")


def _resolve(path: str, key: str) -> Any:
    """The object `path` names, imported only when its package is granted, and defined inside that package."""
    package = path.split(".")[0]
    if package not in granted():
        how = f"--allow {package} on this command (or MHALAB_ALLOW={package})" if grantable(package) else \
            f"{package} is not your own package and cannot be granted"
        raise ConfigError(f"{key}={path!r}: not an allowed class; allowed are mhalab's own classes, Lightning's "
                          "loggers and callbacks, the Hydra launcher and sweeper plugins (mhalab.targets), and "
                          f"classes of packages you grant: {how}")
    from hydra.utils import get_object

    try:
        obj = get_object(path)
    except Exception as e:  # noqa: BLE001 - an import error of the user's own package, or a missing name
        raise ConfigError(f"{key}={path!r}: cannot be found ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''})") from None
    module = getattr(obj, "__module__", None) or ""
    if module.split(".")[0] != package:
        raise ConfigError(f"{key}={path!r}: {_what(obj)} defined in {module or 'no module'}, outside the granted "
                          f"package {package}; only what {package} itself defines may be named")
    return obj


def _what(obj: Any) -> str:
    kind = "a class" if inspect.isclass(obj) else "a function" if callable(obj) else f"a {type(obj).__name__}"
    return f"{kind} ({getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)})"


def _interpolations(node: Any, path: str) -> Iterator[tuple[str, str]]:
    """(key, raw text) of every value of the config that holds an interpolation, nodes set to one included."""
    if isinstance(node, (DictConfig, ListConfig)):
        if node._is_interpolation():
            yield path, str(node._value())
            return
        if node._is_none() or node._is_missing():
            return
        keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
        for key in keys:
            child_path = (f"{path}.{key}" if path else str(key)) if isinstance(node, DictConfig) else f"{path}[{key}]"
            yield from _interpolations(node._get_node(key), child_path)
    elif node is not None and node._is_interpolation():
        yield path, str(node._value())


def _targets(node: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(key, raw value) of every `_target_` in the config; interpolations are not resolved."""
    if isinstance(node, DictConfig):
        if node._is_none() or node._is_missing() or node._is_interpolation():
            return
        for key in node.keys():
            child_path = f"{path}.{key}" if path else str(key)
            child = node._get_node(key)
            if key == "_target_":
                yield child_path, child._value() if child is not None else None
                continue
            if isinstance(child, (DictConfig, ListConfig)):
                yield from _targets(child, child_path)
    elif isinstance(node, ListConfig):
        if node._is_none() or node._is_missing() or node._is_interpolation():
            return
        for i in range(len(node)):
            child = node._get_node(i)
            if isinstance(child, (DictConfig, ListConfig)):
                yield from _targets(child, f"{path}[{i}]")


def check_logging(node: Any, path: str) -> None:
    """Python logging config (plain data, resolved or not): handler and formatter classes from LOGGING_CLASSES, no
    `()` factories or `.` attributes, no `ext://` name but the standard streams, no interpolated class."""
    if isinstance(node, dict):
        section = path.split(".")[2] if path.count(".") >= 3 else ""
        for key, value in node.items():
            child = f"{path}.{key}"
            if key in ("()", "."):
                raise ConfigError(f"{child}: logging factories and attribute settings ('()', '.') are refused in a "
                                  "config")
            if key == "class":
                allowed = LOGGING_CLASSES.get(section, ())
                if value not in allowed:
                    raise ConfigError(f"{child}={value!r}: logging {section or 'classes'} must be one of "
                                      f"{', '.join(allowed) or 'none here'}")
            check_logging(value, child)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            check_logging(value, f"{path}[{i}]")
    elif isinstance(node, str) and node.startswith("ext://") and node not in LOGGING_STREAMS:
        raise ConfigError(f"{path}={node!r}: logging config may name only {' or '.join(LOGGING_STREAMS)} (ext:// "
                          "imports a module)")
