"""Values from the environment are not written in clear: a config value that comes from `${oc.env:NAME}` (directly,
or through interpolations of other keys) is replaced by `<redacted: oc.env:NAME>` in everything a run writes or
hands to a logger: summary.json, `.hydra/defining.json`, the hyperparameters and the constructor arguments of the
loggers (wandb's tags and config, CSV and TensorBoard `hparams.yaml`).

The run itself keeps the real values in memory (a data path or a setting a callback needs works as given), and a
logger gets the real value of its network settings (`mhalab.config.network.NETWORK_KEYS`: `api_key`, `base_url`
...), which it needs to work and which only the command line or the environment may set. Hydra writes
`.hydra/config.yaml` and `hydra.yaml` unresolved (the `${oc.env:NAME}` text, not the value) and `overrides.yaml` as
typed. `MHALAB_ROOT` (the default `paths.root_dir`) is a location, not a secret: it is left as it is.

`Redaction.of(cfg)` finds the keys by resolving the config's interpolations with `oc.env` answering a marker
instead of the value, so a key that interpolates another (`logger.wandb.tags: ${tags}`) is found too; then every
string that still contains one of those values (a value given twice, or built into another string) has it
replaced as well (values of MIN_SUBSTRING characters or more).
"""

from __future__ import annotations

import copy
import os
import re
from typing import Any

from omegaconf import DictConfig, OmegaConf

MARK = "<redacted: oc.env:{}>"
LOCATIONS = ("MHALAB_ROOT",)  # where files go (paths.root_dir's default), not a secret
MIN_SUBSTRING = 6  # a shorter value is replaced only at the keys that take it from the environment
_SENTINEL = "@@mhalab-oc.env:{}@@"
_FOUND = re.compile(r"@@mhalab-oc\.env:([^@]*)@@")
_NAMED = re.compile(r"oc\.env\s*:\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)")


class Redaction:
    """The keys of a config whose values come from the environment, and how to take them out of data to write."""

    def __init__(self, marks: dict[tuple, str], values: dict[str, str]):
        self.marks = marks  # key path (dict keys and list indexes) -> marker
        self.values = values  # an environment variable's value -> marker

    @classmethod
    def of(cls, cfg: DictConfig) -> "Redaction":
        """The redaction of a composed or running job's config (Hydra's own node is not written resolved)."""
        raw = {}
        for key in (k for k in cfg.keys() if k != "hydra"):  # Hydra's large node left out: not written resolved
            node = cfg._get_node(key)
            raw[key] = OmegaConf.to_container(node, resolve=False) if OmegaConf.is_config(node) else node._value()
        interpolated = [(path, text) for path, text in _leaves(raw) if isinstance(text, str) and "${" in text]
        marks: dict[tuple, str] = {}
        names_used: set[str] = set()
        if not any(set(_NAMED.findall(text)) - set(LOCATIONS) or text.count("oc.env") > len(_NAMED.findall(text))
                   for _, text in interpolated):
            return cls(marks, {})  # no value from the environment (the usual case): nothing to resolve
        with _marking_resolvers():
            for path, text in interpolated:
                try:  # a key that interpolates a list or a dict: each of its leaves
                    found = [(path + sub, _FOUND.findall(str(v))) for sub, v in _leaves(_get(cfg, path))]
                except Exception:  # noqa: BLE001 - unresolvable here, or a typed key refusing the marker: the text
                    found = [(path, _NAMED.findall(text))]
                for where, names in found:
                    names = sorted(set(n for n in names if n not in LOCATIONS))
                    if names:
                        marks[where] = MARK.format(",".join(names))
                        names_used.update(names)
        values = {os.environ[n]: MARK.format(n) for n in sorted(names_used)
                  if len(os.environ.get(n, "")) >= MIN_SUBSTRING}
        return cls(marks, values)

    def keys(self) -> list[str]:
        """The dotted keys redacted (for the console line)."""
        return [".".join(str(p) for p in path) for path in self.marks]

    def __call__(self, data: Any, prefix: tuple = (), keep: tuple[str, ...] = ()) -> Any:
        """A copy of plain data (the config at `prefix`, e.g. `("logger",)`) with every value from the environment
        replaced by its marker; keys named in `keep` (a logger's network settings) keep their values."""
        out = copy.deepcopy(data)
        for path, mark in self.marks.items():
            if path[:len(prefix)] == prefix and not set(map(str, path)) & set(keep):
                out = _set(out, path[len(prefix):], mark)
        return self._scrub(out, keep)

    def _scrub(self, node: Any, keep: tuple[str, ...]) -> Any:
        if isinstance(node, dict):
            return {k: v if k in keep else self._scrub(v, keep) for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            return type(node)(self._scrub(v, keep) for v in node)
        if isinstance(node, str):
            for value, mark in self.values.items():
                node = node.replace(value, mark)
        return node


def _leaves(node: Any, path: tuple = ()):
    """(key path, raw value) of every leaf of plain data."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaves(v, path + (i,))
    else:
        yield path, node


def _get(cfg: Any, path: tuple) -> Any:
    node = cfg
    for p in path:
        node = node[p]
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def _set(data: Any, path: tuple, value: Any) -> Any:
    """data with the leaf at path set (nothing when the path is not there)."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(data, dict) and head in data:
        data[head] = _set(data[head], rest, value)
    elif isinstance(data, list) and isinstance(head, int) and head < len(data):
        data[head] = _set(data[head], rest, value)
    return data


class _marking_resolvers:
    """`oc.env` answers a marker naming the variable, `hydra` a placeholder (no Hydra config is needed), for the
    resolution that finds the keys; the real resolvers come back after."""

    def __enter__(self):
        from omegaconf.basecontainer import BaseContainer

        self.saved = {k: BaseContainer._resolvers.get(k) for k in ("oc.env", "hydra")}
        for name, fn in (("oc.env", lambda key, default=None: _SENTINEL.format(key)), ("hydra", lambda *a: "hydra")):
            OmegaConf.register_new_resolver(name, fn, replace=True)
        return self

    def __exit__(self, *exc) -> None:
        from omegaconf.basecontainer import BaseContainer

        for name, fn in self.saved.items():
            if fn is None:
                BaseContainer._resolvers.pop(name, None)
            else:
                BaseContainer._resolvers[name] = fn
