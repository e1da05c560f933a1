"""The config a command will run, composed as `@hydra.main` will compose it, through Hydra's public API.

`Composer(args)` initializes Hydra on the search path `hydra.main` builds from its flags (`-cp/--config-path`,
`-cn/--config-name`, `-cd/--config-dir`, the task function's module) with `hydra.initialize_config_module` or
`hydra.initialize_config_dir`, and composes with `hydra.compose(..., return_hydra_config=True)`, so the preflight checks
the config the run will get. A sweep is expanded into its jobs with Hydra's public override parser, as Hydra's basic
sweeper expands it, and each job is composed as its launcher composes it.

`guard_sources()` makes a `pkg://` search path (`-cp pkg://x`, `hydra.searchpath=[pkg://x]`) name only mhalab,
Hydra and its plugins, or a package the command line granted (`mhalab.targets.granted`): Hydra imports such a
package to read it, so anything else is refused before it is imported.
"""

from __future__ import annotations

import argparse
import itertools
import os
from pathlib import Path
from typing import Any, Callable

from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import DictConfig, OmegaConf, open_dict

from mhalab.errors import ConfigError

CONFIG_PATH = "pkg://mhalab.conf"
CONFIG_NAME = "train"
TASK_MODULE = "mhalab.training.train"  # the module of the task function: Hydra resolves a relative -cp against it
TRUSTED_PACKAGES = ("mhalab", "hydra", "hydra_plugins")  # config packages Hydra may import without a grant
# Hydra's flags: what each does under mhalab (the flags of hydra-core 1.3's parser, mirrored by `parser()`)
RUN_FLAGS = ("multirun", "run", "config_path", "config_name", "config_dir")
SHOW_FLAGS = ("help", "hydra_help", "cfg", "info", "resolve", "package")  # print, run no job (--version exits)
REFUSED_FLAGS = {"experimental_rerun": "it unpickles a file, which can run any code",
                 "shell_completion": "mhalab does not install or answer Hydra's shell completion"}


def parser() -> argparse.ArgumentParser:
    """The command line `hydra.main` reads (hydra-core 1.3's flags, with its short forms)."""
    from hydra import __version__

    p = argparse.ArgumentParser(add_help=False, description="Hydra")
    p.add_argument("--help", "-h", action="store_true")
    p.add_argument("--hydra-help", action="store_true")
    p.add_argument("--version", action="version", version=f"Hydra {__version__}")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--cfg", "-c", choices=["job", "hydra", "all"])
    p.add_argument("--resolve", action="store_true")
    p.add_argument("--package", "-p")
    p.add_argument("--run", "-r", action="store_true")
    p.add_argument("--multirun", "-m", action="store_true")
    p.add_argument("--shell-completion", "-sc", action="store_true")
    p.add_argument("--config-path", "-cp")
    p.add_argument("--config-name", "-cn")
    p.add_argument("--config-dir", "-cd")
    p.add_argument("--experimental-rerun")
    p.add_argument("--info", "-i", const="all", nargs="?",
                   choices=["all", "config", "defaults", "defaults-tree", "plugins", "searchpath"])
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Hydra's command line; an unknown or refused flag is one sentence (ConfigError)."""
    p = parser()

    def error(message: str):
        raise ConfigError(f"{message} (mhalab train takes Hydra's flags -m, -cp, -cn, --config-dir, --cfg, --info "
                          "and --hydra-help, and --allow PACKAGE)")

    p.error = error
    args = p.parse_args(argv)
    for flag, why in REFUSED_FLAGS.items():
        if getattr(args, flag):
            raise ConfigError(f"--{flag.replace('_', '-')} is refused: {why}")
    return args


def shows_only(args: argparse.Namespace) -> bool:
    """A flag that makes Hydra print something (help, the config, info) instead of running a job."""
    return any(getattr(args, flag) for flag in ("help", "hydra_help", "cfg", "info"))


def config_source(config_path: str, task_module: str = TASK_MODULE) -> str:
    """Where `hydra.main(config_path=...)` of a task function in `task_module` reads its primary config: an absolute
    folder or `pkg://` as given; a relative path inside the task module's package, each `../` one package up."""
    if os.path.isabs(config_path) or config_path.startswith("pkg://"):
        return config_path
    package = task_module.rpartition(".")[0]
    path = config_path.replace(os.path.sep, "/")
    while path.startswith("../"):
        path, package = path[3:], package.rpartition(".")[0]
    return f"pkg://{package}/{path}" if package else f"pkg://{path}"


class Composer:
    """Hydra initialized as `hydra.main(config_path=CONFIG_PATH, config_name=CONFIG_NAME)(task_function)` sets it up
    for these flags; `close()` (or `with`) forgets it again."""

    def __init__(self, args: argparse.Namespace, task_function: Callable | None = None):
        from hydra import initialize_config_dir, initialize_config_module
        from hydra.core.global_hydra import GlobalHydra

        guard_sources()
        self._bases: dict[tuple[str, ...], DictConfig | None] = {}  # job_config's compositions by their overrides
        self._group_names: set[str] | None = None
        self.config_name = args.config_name or CONFIG_NAME
        module = TASK_MODULE if task_function is None else task_function.__module__
        job_name = module.rpartition(".")[2]  # Hydra's task name: the task module's last part
        source = config_source(args.config_path or CONFIG_PATH, module)
        GlobalHydra.instance().clear()
        if args.config_dir is not None:
            config_dir = os.path.abspath(args.config_dir)
            if not os.path.isdir(config_dir):
                raise ConfigError(f"--config-dir {args.config_dir}: no such directory")
            ConfigDir.path = f"file://{config_dir}"
        try:
            with _hydra_errors():
                if source.startswith("pkg://"):
                    initialize_config_module(source.removeprefix("pkg://"), job_name=job_name, version_base="1.3")
                else:
                    initialize_config_dir(source, job_name=job_name, version_base="1.3")
        finally:
            ConfigDir.path = None

    def __enter__(self) -> "Composer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        from hydra.core.global_hydra import GlobalHydra

        GlobalHydra.instance().clear()

    def multirun(self, overrides: list[str]) -> bool:
        """Whether Hydra will run these overrides as a multirun without -m (`hydra.mode` set by a config)."""
        from hydra.types import RunMode

        try:
            cfg = self._compose([o.input_line for o in _parsed(overrides) if not o.is_sweep_override()])
        except ConfigError:
            return False
        return OmegaConf.select(cfg, "hydra.mode") == RunMode.MULTIRUN

    def run_config(self, overrides: list[str]) -> DictConfig:
        """The config of a single run, as `hydra.main` composes it: where no config sets `hydra.mode`, Hydra adds
        `hydra.mode=RUN` to the overrides (hydra-core 1.3's `_run_app`), applied here to the one composition."""
        from hydra.types import RunMode

        cfg = self._compose(list(overrides))
        if OmegaConf.select(cfg, "hydra.mode") is None:
            cfg.hydra.mode = RunMode.RUN
            cfg.hydra.overrides.hydra.append("hydra.mode=RUN")
        return cfg

    def sweep_config(self, overrides: list[str]) -> DictConfig:
        """The master config of a multirun (its sweep values left out: each job has its own)."""
        parsed = _parsed(overrides)
        for o in parsed:
            if o.is_sweep_override() and o.is_hydra_override():
                raise ConfigError(f"{o.input_line}: sweeping over Hydra's configuration is not supported")
        return self._compose([o.input_line for o in parsed if not o.is_sweep_override()] + ["hydra.mode=MULTIRUN"])

    def sweep_jobs(self, master: DictConfig, overrides: list[str]) -> list[list[str]]:
        """The jobs of a grid sweep, as Hydra's basic sweeper expands them (`grid`): `hydra.sweeper.params`, then the
        command line's overrides other than Hydra's."""
        params = [f"{k}={v}" for k, v in (OmegaConf.select(master, "hydra.sweeper.params", default=None) or {}).items()]
        with _hydra_errors():
            return grid([o.input_line for o in _parsed(params + list(overrides)) if not o.is_hydra_override()])

    def launch_overrides(self, overrides: list[str], sweep_dir: str | None, multirun_flag: bool) -> list[str]:
        """The Hydra overrides a sweep's launcher composes each job with (`hydra.overrides.hydra` of the master
        config `hydra.main` composes): the command line's, then `hydra.sweep.dir=<sweep_dir>` when the preflight adds
        it, then `hydra.mode=MULTIRUN` when Hydra adds it (-m, and no `hydra.mode` on the command line)."""
        hydra = [o.input_line for o in _parsed(overrides) if o.is_hydra_override()]
        tail = [f"hydra.sweep.dir={sweep_dir}"] if sweep_dir is not None else []
        if multirun_flag and not any(o.get_key_element() == "hydra.mode" for o in _parsed(overrides)):
            tail.append("hydra.mode=MULTIRUN")
        return hydra + tail

    def job_config(self, hydra: list[str], job: list[str], num: int) -> DictConfig:
        """A sweep job's config, as its launcher composes it (`hydra.compose` of the same overrides: Hydra's
        `load_sweep_config`): the Hydra overrides `hydra` (`launch_overrides`), then the job's; its number set.

        Hydra composes once per distinct choice of config groups (`_base`); a job that differs from it only in
        values (`seed=3`, `optim.lr=1e-3`) is a copy with those values applied (`_with_values`), which
        tests/config/test_job_configs.py holds equal to Hydra's own composition of the job."""
        lines = list(hydra) + list(job)
        with _hydra_errors(job):
            parsed = _parsed(lines)
            groups, own = self._groups(), parsed[len(hydra):]
            values = [o for o in own if _maybe_value(o, groups)]
            base = self._base(list(hydra) + [o.input_line for o in own if not _maybe_value(o, groups)])
            cfg = _with_values(base, parsed, values) if base is not None else None
            if cfg is None:  # a key that names a config group, or one the config lacks: Hydra's own composition
                cfg = self._compose(lines)
        with open_dict(cfg.hydra):
            cfg.hydra.job.id, cfg.hydra.job.num = str(num), num
        return cfg

    def _groups(self) -> set[str]:
        """The top-level config groups of the search path (`model`, `data`, ...): `key=value` with such a key
        chooses an option, never sets a value."""
        from hydra.core.global_hydra import GlobalHydra

        if self._group_names is None:
            self._group_names = set(GlobalHydra.instance().config_loader().list_groups(""))
        return self._group_names

    def _base(self, lines: list[str]) -> DictConfig | None:
        """Hydra's composition of these overrides, kept for the jobs that share them (None where Hydra refuses
        them: the job's own composition then says why)."""
        key = tuple(lines)
        if key not in self._bases:
            try:
                self._bases[key] = self._compose(lines)
            except ConfigError:
                self._bases[key] = None
        return self._bases[key]

    def files_setting(self, cfg: DictConfig, key: str) -> list[str]:
        """The config files in folders (the primary one, and each chosen group option of the global package) that
        set the top-level `key` (to name them in an error)."""
        choices = OmegaConf.to_container(cfg.hydra.runtime.choices)
        names = [self.config_name] + [f"{group}/{choice}" for group, choice in choices.items()
                                      if isinstance(choice, str) and not group.startswith("hydra/")]
        found = []
        for source in cfg.hydra.runtime.config_sources:
            if source.schema != "file":
                continue
            for name in names:
                path = Path(source.path) / f"{name}.yaml"
                if not path.is_file():
                    continue
                text = path.read_text()
                loaded = OmegaConf.create(text)
                own = name == self.config_name or "# @package _global_" in text
                if own and OmegaConf.is_dict(loaded) and loaded.get(key):
                    found.append(f"{source.path}/{name}.yaml")
        return sorted(set(found))

    def _compose(self, overrides: list[str]) -> DictConfig:
        from hydra import compose

        with _hydra_errors(overrides):
            return compose(self.config_name, list(overrides), return_hydra_config=True)


class ConfigDir(SearchPathPlugin):
    """A search-path plugin (Hydra's public way to add to the search path) that adds `--config-dir` where
    `hydra.main` adds it, after the primary config's folder and before the structured configs, while a Composer
    initializes Hydra; registered by `guard_sources`."""

    path: str | None = None

    def manipulate_search_path(self, search_path) -> None:
        if ConfigDir.path is not None:
            search_path.append(provider="command-line", path=ConfigDir.path)


def _parsed(overrides: list[str]) -> list:
    """The overrides as Hydra's public override parser reads them; a syntax error is one sentence."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    with _hydra_errors(overrides):
        return OverridesParser.create().parse_overrides(list(overrides))


def _maybe_value(o, groups: set[str]) -> bool:
    """Whether an override sets a value (`key=value`: no `+`, `++` or `~`, no package, no config group's name or
    path); whether the key is in the config is known once it is composed (`_with_values`)."""
    key = o.key_or_group
    return (not o.is_sweep_override() and not o.is_add() and not o.is_force_add() and not o.is_delete()
            and o.package is None and "/" not in key and key not in groups and not o.is_hydra_override())


def _with_values(base: DictConfig, parsed: list, values: list) -> DictConfig | None:
    """A copy of `base` with `values` applied as Hydra applies a command line's values (its
    `_apply_overrides_to_config`: `OmegaConf.update(..., merge=True)` on the struct config, in order) and its
    record of the overrides (`hydra.overrides`, `hydra.job.override_dirname`) made as for all of `parsed`; None
    when a key names a config group, is not in the config or refuses the value (Hydra then composes, or says why
    not)."""
    import copy

    choices = base.hydra.runtime.choices
    if any(o.key_or_group in choices or _ABSENT is OmegaConf.select(base, o.key_or_group, default=_ABSENT,
                                                                     throw_on_resolution_failure=False)
           for o in values):
        return None
    from omegaconf.errors import OmegaConfBaseException

    cfg = copy.deepcopy(base)
    try:
        for o in values:
            OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True)
    except OmegaConfBaseException:  # e.g. seed=abc: Hydra's composition says why, in its words
        return None
    task = [o for o in parsed if not o.is_hydra_override()]
    cfg.hydra.overrides.task = [o.input_line for o in task]
    cfg.hydra.overrides.hydra = [o.input_line for o in parsed if o.is_hydra_override()]
    dirname = cfg.hydra.job.config.override_dirname  # Hydra's get_overrides_dirname, the same rule
    lines = sorted(o.input_line for o in task if o.key_or_group not in dirname.exclude_keys)
    cfg.hydra.job.override_dirname = dirname.item_sep.join(lines).replace("=", dirname.kv_sep)
    return cfg


_ABSENT = object()


def grid(lines: list[str]) -> list[list[str]]:
    """Every job of a grid sweep of these overrides, as Hydra's basic sweeper expands them: a later value of a key
    replaces an earlier one, every combination, the first key slowest; a sweep that draws values is one sentence."""
    axes: dict[str, list[str]] = {}
    for o in _parsed(lines):
        key = o.get_key_element()
        if not o.is_sweep_override():
            axes[key] = [f"{key}={o.get_value_element_as_str()}"]
        elif o.is_discrete_sweep():
            axes[key] = [f"{key}={v}" for v in o.sweep_string_iterator()]
        else:
            raise ConfigError(f"{o.input_line}: a {o.value_type.name} sweep needs a sweeper that draws values "
                              "(hydra/sweeper=search); the grid sweeper takes lists, ranges and globs")
    return [list(job) for job in itertools.product(*axes.values())]


def unset_job(cfg: DictConfig) -> DictConfig:
    """A job config as composing left it, after checking it: its number (`job_config`) and output folder
    (`resolved`) unset for the launcher to set, and Hydra's node writable again (`HydraConfig.set_config` made it
    read-only)."""
    OmegaConf.set_readonly(cfg.hydra, False)  # as Hydra's composition leaves it
    with open_dict(cfg.hydra):
        cfg.hydra.job.id = cfg.hydra.job.num = cfg.hydra.runtime.output_dir = "???"
    return cfg


HYDRA_NODES = ("job_logging", "hydra_logging", "launcher", "sweeper", "callbacks", "output_subdir")  # resolved


def resolved(cfg: DictConfig, output_dir: str) -> dict:
    """The config as plain data, resolved as in the job that runs in `output_dir` (`${hydra:...}` too); of
    Hydra's node only HYDRA_NODES and `job.chdir`, the parts that instantiate or write.

    Sets `hydra.runtime.output_dir` as Hydra does when the job starts; an unresolvable value is one sentence."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    with open_dict(cfg.hydra):
        cfg.hydra.runtime.output_dir = str(output_dir)
    hc = HydraConfig.instance()
    before = hc.cfg
    try:
        hc.set_config(cfg)
        with _hydra_errors():
            plain = {key: _plain(cfg, key) for key in cfg if key != "hydra"}
            plain["hydra"] = {key: _plain(cfg.hydra, key) for key in HYDRA_NODES if key in cfg.hydra}
            plain["hydra"]["job"] = {"chdir": cfg.hydra.job.chdir}
            return plain
    finally:
        hc.cfg = before


def _plain(node: DictConfig, key: str) -> Any:
    value = node._get_node(key)
    if OmegaConf.is_config(value):
        return OmegaConf.to_container(value, resolve=True, throw_on_missing=False)
    return node[key]


class _hydra_errors:
    """Hydra's and OmegaConf's errors while composing become one ConfigError sentence with Hydra's hints."""

    def __init__(self, overrides: list[str] | tuple = ()):
        self.overrides = overrides

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb) -> bool:
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

        if e is None or isinstance(e, ConfigError) or not isinstance(e, Exception):
            return False
        if isinstance(e.__cause__ or e.__context__, ConfigError):  # a guard's sentence, wrapped by Hydra
            raise e.__cause__ or e.__context__ from None
        missing = _missing_key(e)
        if missing is not None:  # before Hydra's hint to append with `+`: the key is likely mistyped
            raise missing from None
        if isinstance(e, (HydraException, OmegaConfBaseException)):
            raise ConfigError(hydra_message(e)) from None
        what = f"the overrides {' '.join(self.overrides)}" if self.overrides else "the config"
        raise ConfigError(f"{what} cannot be composed ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}); check their keys and values") from None


def _missing_key(e: BaseException) -> ConfigError | None:
    """An override of a key the schema does not have (OmegaConf's key error under Hydra's), as one sentence."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    from mhalab.checks import unknown_key

    for err in (e, e.__cause__, e.__context__):
        parent = getattr(err, "parent_node", None)
        if isinstance(err, (ConfigAttributeError, ConfigKeyError)) and OmegaConf.is_dict(parent) and \
                getattr(err, "full_key", None) and getattr(err, "key", None) not in parent:
            return unknown_key(err.full_key, list(parent.keys()), addable=OmegaConf.get_type(parent) is dict)
    return None


def hydra_message(e: BaseException) -> str:
    """Hydra's error with its hints ('Available options', 'use +key'), without OmegaConf's object_type lines."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    keep = [ln for ln in lines if not ln.startswith(("object_type=", "reference_type="))]
    cause = e.__cause__ or e.__context__
    if cause is not None and str(cause).strip() and str(cause).strip() not in str(e):
        keep += [ln.strip() for ln in str(cause).strip().splitlines()
                 if ln.strip() and not ln.strip().startswith(("object_type=", "reference_type="))]
    return " ".join(keep)


def _hydra_sources() -> tuple[Any, type]:
    """Hydra's registry of config-source schemes and its `pkg://` source class: the one use of `hydra._internal`.

    Checked on hydra-core 1.3.8: Hydra imports a `pkg://` search path's package while it composes, and has no
    public hook that sees the path first (a ConfigSource plugin registers a new scheme, never a guarded `pkg`)."""
    from hydra._internal.core_plugins.importlib_resources_config_source import ImportlibResourcesConfigSource
    from hydra._internal.sources_registry import SourcesRegistry

    return SourcesRegistry, ImportlibResourcesConfigSource


def guard_sources() -> None:
    """Make Hydra read `pkg://` config sources through GuardedPackageSource (idempotent; it stays for the process,
    so Hydra's own composition in the run is guarded too)."""
    from hydra.core.plugins import Plugins

    Plugins.instance()  # Hydra registers its own sources first; this one then replaces the pkg:// one
    _hydra_sources()[0].instance().types["pkg"] = GuardedPackageSource
    Plugins.instance().register(ConfigDir)  # Hydra's public registration (idempotent)


class GuardedPackageSource(_hydra_sources()[1]):
    """Hydra's `pkg://` config source, refusing a package neither trusted nor granted before importing it."""

    def __init__(self, provider: str, path: str) -> None:
        from mhalab.targets import granted

        name = path.removeprefix("pkg://")
        package = name.replace("/", ".").strip(".").split(".")[0]
        if package not in TRUSTED_PACKAGES and package not in granted():
            raise ConfigError(f"config search path pkg://{name} (from {provider}) is refused: Hydra would import "
                              f"the package {package!r} to read it; only mhalab, Hydra and its plugins and packages "
                              "granted with --allow may be searched (use a folder: --config-dir DIR)")
        super().__init__(provider, path)


# Hydra's registry accepts a second registration of a scheme only under the same class name: a joblib or submitit
# worker restores Hydra's singletons (this class among them) and then registers Hydra's own sources again.
GuardedPackageSource.__name__ = _hydra_sources()[1].__name__
