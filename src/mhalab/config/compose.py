"""The config a command will run, composed exactly as `@hydra.main` will compose it, and only once.

`Composer(args)` builds the config search path from Hydra's own flags as `hydra.main` does (`-cp/--config-path`,
`-cn/--config-name`, `-cd/--config-dir`, the task function's module) and composes with Hydra's own loader, so the
preflight checks the config the run will get. Composing is slow (half a second: the defaults list and the merge of
every file), so a composer remembers both per choice of config groups: the jobs of a sweep that differ only in
values each cost one copy and their own overrides (milliseconds).

`guard_sources()` makes a `pkg://` search path (`-cp pkg://x`, `hydra.searchpath=[pkg://x]`) name only mhalab,
Hydra and its plugins, or a package the command line granted (`mhalab.targets.granted`): Hydra imports such a
package to read it, so anything else is refused before it is imported.
"""

from __future__ import annotations

import argparse
import copy
import os
from typing import Any, Callable

from hydra._internal.core_plugins.importlib_resources_config_source import ImportlibResourcesConfigSource
from omegaconf import DictConfig, OmegaConf

from mhalab.errors import ConfigError

CONFIG_PATH = "pkg://mhalab.conf"
CONFIG_NAME = "train"
TASK_MODULE = "mhalab.training.train"  # the module of the task function: Hydra resolves a relative -cp against it
TRUSTED_PACKAGES = ("mhalab", "hydra", "hydra_plugins")  # config packages Hydra may import without a grant
# Hydra's flags: what each does under mhalab (every flag of hydra-core 1.3's parser is named here)
RUN_FLAGS = ("multirun", "run", "config_path", "config_name", "config_dir")
SHOW_FLAGS = ("help", "hydra_help", "cfg", "info", "resolve", "package")  # print, run no job (--version exits)
REFUSED_FLAGS = {"experimental_rerun": "it unpickles a file, which can run any code",
                 "shell_completion": "mhalab does not install or answer Hydra's shell completion"}


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Hydra's command-line parser; an unknown or refused flag is one sentence (ConfigError)."""
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()

    def error(message: str):
        raise ConfigError(f"{message} (mhalab train takes Hydra's flags -m, -cp, -cn, --config-dir, --cfg, --info "
                          "and --hydra-help, and --allow PACKAGE)")

    parser.error = error
    args = parser.parse_args(argv)
    known = set(RUN_FLAGS) | set(SHOW_FLAGS) | set(REFUSED_FLAGS) | {"overrides"}
    unknown = sorted(set(vars(args)) - known)
    if unknown:  # a newer Hydra with flags this preflight does not know: refuse rather than guess
        raise ConfigError(f"Hydra flag(s) {', '.join(unknown)} are not understood by mhalab's preflight; "
                          "hydra-core 1.3 is supported")
    for flag, why in REFUSED_FLAGS.items():
        if getattr(args, flag):
            raise ConfigError(f"--{flag.replace('_', '-')} is refused: {why}")
    return args


def shows_only(args: argparse.Namespace) -> bool:
    """A flag that makes Hydra print something (help, the config, info) instead of running a job."""
    return any(getattr(args, flag) for flag in ("help", "hydra_help", "cfg", "info"))


class Composer:
    """Hydra set up as `hydra.main(config_path=CONFIG_PATH, config_name=CONFIG_NAME)(task_function)` sets it up
    for these flags; `close()` (or `with`) forgets it again."""

    def __init__(self, args: argparse.Namespace, task_function: Callable | None = None):
        from hydra._internal.hydra import Hydra
        from hydra._internal.utils import (create_automatic_config_search_path,
                                           detect_calling_file_or_module_from_task_function, detect_task_name,
                                           validate_config_path)
        from hydra.core.global_hydra import GlobalHydra
        from hydra.core.config_search_path import SearchPathQuery

        guard_sources()
        self.config_name = args.config_name or CONFIG_NAME
        config_path = args.config_path or CONFIG_PATH
        if task_function is None:
            calling_file, calling_module = None, TASK_MODULE
        else:
            calling_file, calling_module = detect_calling_file_or_module_from_task_function(task_function)
        self._defaults: dict[tuple, Any] = {}
        self._merged: dict[int, DictConfig] = {}
        with _hydra_errors():
            validate_config_path(config_path)
            search_path = create_automatic_config_search_path(calling_file, calling_module, config_path)
            if args.config_dir is not None:
                config_dir = os.path.abspath(args.config_dir)
                if not os.path.isdir(config_dir):
                    raise ConfigError(f"--config-dir {args.config_dir}: no such directory")
                search_path.prepend(provider="command-line", path=f"file://{config_dir}",
                                    anchor=SearchPathQuery(provider="schema"))
            GlobalHydra.instance().clear()
            self.hydra = Hydra.create_main_hydra2(task_name=detect_task_name(calling_file, calling_module),
                                                  config_search_path=search_path)
        loader = self.hydra.config_loader
        merge = loader._compose_config_from_defaults_list

        def merged(defaults, repo):  # one merge per defaults list; each job gets a copy
            if id(defaults) not in self._merged:
                self._merged[id(defaults)] = merge(defaults=defaults, repo=repo)
            return copy.deepcopy(self._merged[id(defaults)])

        loader._compose_config_from_defaults_list = merged

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

        with self._cached_defaults(), _hydra_errors():
            return self.hydra.get_mode(self.config_name, overrides) == RunMode.MULTIRUN

    def launch_run(self, task_function: Callable, overrides: list[str], mode) -> None:
        """Run one job as `hydra.main` runs it (Hydra's own `_run_app`: composing with logging set up, the run
        directory, `.hydra/`, the job), on this composer's Hydra: its composition reuses the preflight's defaults
        list and merge, and `mode` is the `hydra.mode` the preflight composed (Hydra's `get_mode` would compose
        it again)."""
        from hydra._internal.utils import _run_app

        with self._cached_defaults():
            _run_app(run=True, multirun=False, mode=mode, hydra=self.hydra, config_name=self.config_name,
                     task_function=task_function, overrides=list(overrides))

    def run_config(self, overrides: list[str]) -> DictConfig:
        """The config of a single run, as `hydra.run` composes it."""
        from hydra.types import RunMode

        return self._compose(overrides, RunMode.RUN)

    def sweep_config(self, overrides: list[str]) -> DictConfig:
        """The master config of a multirun, as `hydra.multirun` composes it."""
        from hydra.types import RunMode

        return self._compose(overrides, RunMode.MULTIRUN)

    def job_config(self, master: DictConfig, job_overrides: list[str], num: int) -> DictConfig:
        """A sweep job's config, as the launchers compose it (`load_sweep_config`, then the job's number)."""
        from omegaconf import open_dict

        with self._cached_defaults(), _hydra_errors(job_overrides):
            cfg = self.hydra.config_loader.load_sweep_config(master, list(job_overrides))
        with open_dict(cfg.hydra):
            cfg.hydra.job.id, cfg.hydra.job.num = str(num), num
        return cfg

    def files_setting(self, key: str) -> list[str]:
        """The config files composed so far that set the top-level `key` (to name them in an error)."""
        found = []
        for dl, repo in self._defaults.values():
            for d in dl.defaults:
                if d.config_path is None or d.package not in ("", None):
                    continue
                loaded = repo.load_config(d.config_path)
                if loaded is not None and not loaded.path.startswith("structured://") and \
                        OmegaConf.is_dict(loaded.config) and loaded.config.get(key):
                    found.append(f"{loaded.path}/{d.config_path}.yaml")
        return sorted(set(found))

    def _compose(self, overrides: list[str], mode) -> DictConfig:
        with self._cached_defaults(), _hydra_errors(overrides):
            return self.hydra.compose_config(self.config_name, list(overrides), run_mode=mode,
                                             with_log_configuration=False)

    def _cached_defaults(self):
        """Hydra's defaults list computed once per choice of config groups (values do not change it)."""
        import contextlib

        from hydra._internal import config_loader_impl

        create = config_loader_impl.create_defaults_list
        cache = self._defaults

        def cached(repo, config_name, overrides_list, prepend_hydra, skip_missing):
            groups = [o.input_line for o in overrides_list if not o.is_sweep_override() and
                      repo.group_exists(o.key_or_group) and not isinstance(o.value(), dict)]
            key = (config_name, tuple(groups), prepend_hydra, skip_missing,
                   tuple(f"{s.scheme()}://{s.path}" for s in repo.get_sources()))
            if key not in cache:
                cache[key] = (create(repo=repo, config_name=config_name, overrides_list=overrides_list,
                                     prepend_hydra=prepend_hydra, skip_missing=skip_missing), repo)
            dl = cache[key][0]
            values = [o for o in overrides_list if not o.is_sweep_override() and
                      (isinstance(o.value(), dict) or not repo.group_exists(o.key_or_group))]
            return type(dl)(defaults=dl.defaults, defaults_tree=dl.defaults_tree, overrides=dl.overrides,
                            config_overrides=values)

        @contextlib.contextmanager
        def patched():
            config_loader_impl.create_defaults_list = cached
            try:
                yield
            finally:
                config_loader_impl.create_defaults_list = create

        return patched()


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


def guard_sources() -> None:
    """Make Hydra read `pkg://` config sources through GuardedPackageSource (idempotent; it stays for the process,
    so Hydra's own composition in the run is guarded too)."""
    from hydra._internal.sources_registry import SourcesRegistry
    from hydra.core.plugins import Plugins

    Plugins.instance()  # Hydra registers its own sources first; this one then replaces the pkg:// one
    SourcesRegistry.instance().types["pkg"] = GuardedPackageSource


class GuardedPackageSource(ImportlibResourcesConfigSource):
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
GuardedPackageSource.__name__ = ImportlibResourcesConfigSource.__name__
