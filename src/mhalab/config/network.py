"""What may send a run's data off the machine: only this command's own line or environment decides.

A logger setting that sends data or says where to (wandb `mode` other than offline/disabled, `base_url`,
`api_key`, `host`, `entity` ..., NETWORK_KEYS) and a logger that sends by design (REMOTE_LOGGERS) are accepted only
when a command-line override sets that key (`logger.wandb.mode=online`, `+logger.wandb.settings.base_url=...`, or
a `{...}` value for a node above it), never from a config file: a `--config-dir` file, an experiment, a packaged
yaml or a group chosen on the command line (`logger=x` picks a file, it does not state the value). The same for the
keys of a sweeper's search space (`hydra.sweeper.params`). The Optuna storage is a local sqlite file
(`mhalab.config.writes`). `WANDB_MODE=offline|disabled|dryrun` or `WANDB_DISABLED=true` in the environment always
wins over a config or an override (`environment_wins`).
"""

from __future__ import annotations

import os
from typing import Any

from mhalab.checks import walk
from mhalab.errors import ConfigError

NETWORK_KEYS = ("base_url", "api_key", "api_host", "host", "entity", "tracking_uri", "api_token", "url", "endpoint")
LOCAL_MODES = ("offline", "disabled", "dryrun")  # wandb modes that send nothing
REMOTE_LOGGERS = ("CometLogger", "NeptuneLogger")  # Lightning loggers that send to a server whatever their settings
SECTIONS = ("logger", "callbacks")


def sends(section: str, key: str, value: Any) -> bool:
    """Whether the leaf `key` (dotted, under `section`) with this resolved value sends data off the machine or
    says where to."""
    name = key.rsplit(".", 1)[-1]
    if value is None or value == "" or isinstance(value, (dict, list)):
        return False
    if name in NETWORK_KEYS:
        return True
    if name == "mode" and section == "logger":
        return str(value).lower() not in LOCAL_MODES
    return name == "_target_" and str(value).rsplit(".", 1)[-1] in REMOTE_LOGGERS


def on_command_line(key: str, overrides: list[str] | tuple[str, ...]) -> bool:
    """Whether a command-line override sets `key` itself, or a node above it with a `{...}` value."""
    for o in overrides:
        given, _, value = o.lstrip("~+").partition("=")
        given = given.strip()
        if given == key or (key.startswith(given + ".") and value.lstrip().startswith("{")):
            return True
    return False


def check_network(plain: dict, overrides: list[str] | tuple[str, ...]) -> None:
    """ConfigError naming the first setting that would send data off the machine and did not come from the command
    line. `plain`: the job's resolved config; `overrides`: the command's own overrides (not a sweep's expansion)."""
    for section in SECTIONS:
        for key, value in walk(plain.get(section), section):
            if sends(section, key, value) and not on_command_line(key, overrides):
                raise ConfigError(f"{key} comes from a config file and would send the run's data off this machine "
                                  "(or say where to): such settings are taken only from the command line or the "
                                  f"environment; give it as an override ({key}=...) or leave it out")
    params = ((plain.get("hydra") or {}).get("sweeper") or {}).get("params") or {}
    for key in params:
        section = str(key).lstrip("~+").split(".", 1)[0]
        if section in SECTIONS and str(key).rsplit(".", 1)[-1] in NETWORK_KEYS + ("mode", "_target_") and \
                not on_command_line(f"hydra.sweeper.params.{key}", overrides) and not on_command_line(key, overrides):
            raise ConfigError(f"hydra.sweeper.params.{key} comes from a config file and would choose where the run's "
                              "data is sent: such settings are taken only from the command line")


def environment_mode() -> str | None:
    """wandb's mode as this command's environment fixes it (WANDB_DISABLED, WANDB_MODE), or None."""
    if os.environ.get("WANDB_DISABLED", "").strip().lower() in ("1", "true", "yes"):
        return "disabled"
    mode = os.environ.get("WANDB_MODE", "").strip().lower()
    return mode if mode in LOCAL_MODES else None


def environment_wins(loggers: dict) -> dict:
    """The resolved logger nodes with every wandb logger set to the environment's offline or disabled mode, when the
    environment says so (wandb itself lets an argument win over WANDB_MODE)."""
    mode = environment_mode()
    for node in (loggers or {}).values():
        if mode and isinstance(node, dict) and "wandb" in str(node.get("_target_", "")).lower():
            node["mode"] = mode
            if isinstance(node.get("settings"), dict):
                node["settings"]["mode"] = mode
    return loggers


def no_telemetry(loggers: dict) -> None:
    """wandb sends its own usage metrics (OpenTelemetry, to `base_url`/sdk/otel/v1/...) even offline: unless a wandb
    logger here is online (the command line said so) or this command's environment sets WANDB_ERROR_REPORTING, this
    process turns them off (WANDB_ERROR_REPORTING=false) before any wandb logger is built."""
    wandb = [n for n in (loggers or {}).values()
             if isinstance(n, dict) and "wandb" in str(n.get("_target_", "")).lower()]
    online = any(str((n.get("settings") or {}).get("mode") or n.get("mode") or
                     ("offline" if n.get("offline") else "online")).lower() not in LOCAL_MODES for n in wandb)
    if wandb and not online:
        os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
