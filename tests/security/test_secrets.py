"""Secrets stay on the machine and only the command line sends data off it (issue 24, "Trust boundaries"), each
vector a real `mhalab train` process: a secret in the environment referenced with `${oc.env:...}` appears in no
file under the run (bytes and names, wandb's and TensorBoard's binary files too) and not in what the command
prints; a setting that would send data off the machine is refused when a config file gives it, and a local
listener (127.0.0.1, an ephemeral port) proves that no request left."""

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import TINY, refusal, slow_except

REPO = Path(__file__).resolve().parents[2]
SECRET = "AKIAsecretVALUE0xC0FFEE"
MARK = "<redacted: oc.env:AWS_SECRET_ACCESS_KEY>"
ENV = "${oc.env:AWS_SECRET_ACCESS_KEY}"


def mhalab(root: Path, cache: Path, *args: str, env: dict | None = None, tiny: bool = True,
           timeout: int = 300) -> subprocess.CompletedProcess:
    """`mhalab train [flags] TINY args` as a real process in root: its runs under root/logs, wandb's own folders in
    root, no WANDB_/HF_ setting or allow-list inherited, the current folder not on sys.path (`-P`)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "HF_")) and k != "MHALAB_ALLOW"}
    full.update({"MHALAB_ROOT": str(root), "PYTHONPATH": str(REPO / "src"), "AWS_SECRET_ACCESS_KEY": SECRET,
                 "WANDB_SILENT": "true", "WANDB_CONFIG_DIR": str(root / "wandb_home"),
                 "WANDB_CACHE_DIR": str(root / "wandb_home"), "WANDB_DATA_DIR": str(root / "wandb_home")})
    full.update(env or {})
    flags, overrides, args = [], [], list(args)
    while args:  # Hydra's flags first, then the overrides
        a = args.pop(0)
        if a == "-m":
            flags.append(a)
        elif a in ("--config-dir", "--cfg"):
            flags += [a, args.pop(0)]
        else:
            overrides.append(a)
    argv = [sys.executable, "-P", "-m", "mhalab", "train", *flags, *(TINY if tiny else []), f"data.cache_dir={cache}",
            *overrides]
    root.mkdir(parents=True, exist_ok=True)
    return subprocess.run(argv, cwd=root, env=full, capture_output=True, text=True, timeout=timeout)


def leaks(root: Path, secret: str = SECRET) -> list[str]:
    """Every file under root whose bytes or path hold the secret."""
    found = []
    for p in root.rglob("*"):
        if secret in str(p.relative_to(root)):
            found.append(str(p))
        elif p.is_file() and not p.is_symlink() and secret.encode() in p.read_bytes():
            found.append(str(p))
    return found


# -- secrets ---------------------------------------------------------------------------------------------------

EXPERIMENT = f"# @package _global_\ntags: [from-file, '{ENV}']\nlogger:\n  wandb:\n    notes: '{ENV}'\n"

SECRET_VECTORS = {  # name -> (overrides, dotted keys the console line must name)
    "tags": ([f"tags=[{ENV},plain]", "logger=many"], ["tags.0", "logger.wandb.tags.0"]),
    "logger name": ([f"logger.wandb.name={ENV}", "logger=many"], ["logger.wandb.name"]),
    "config-dir experiment": (["--config-dir", "{confdir}", "experiment=secret", "logger=many"],
                              ["tags.1", "logger.wandb.notes"]),
    "+extra keys": ([f"+logger.wandb.notes={ENV}", f"+logger.wandb.group=run-{ENV}", "logger=many"],
                    ["logger.wandb.notes", "logger.wandb.group"]),
    "sweep": (["-m", f"tags=[{ENV}]", "seed=0,1", "logger=many"], ["tags.0"]),
}


@pytest.mark.proc
@pytest.mark.parametrize("name", slow_except(SECRET_VECTORS, keep={"sweep"}))
def test_a_secret_from_the_environment_is_written_nowhere(tmp_path, data_cache, name):
    overrides, keys = SECRET_VECTORS[name]
    confdir = tmp_path / "conf"
    (confdir / "experiment").mkdir(parents=True)
    (confdir / "experiment" / "secret.yaml").write_text(EXPERIMENT)
    r = mhalab(tmp_path, data_cache, *(o.replace("{confdir}", str(confdir)) for o in overrides))
    assert r.returncode == 0, r.stderr[-3000:]
    assert SECRET not in r.stdout + r.stderr
    assert leaks(tmp_path) == []
    summaries = sorted((tmp_path / "logs").rglob("summary.json"))
    assert len(summaries) == (2 if "-m" in overrides else 1)
    run_dir = summaries[0].parent
    assert MARK in (run_dir / "summary.json").read_text()  # the marker is there, in place of the value
    # defining.json (what resume matches on) leaves the loggers out
    assert (MARK in (run_dir / ".hydra" / "defining.json").read_text()) == any(k.startswith("tags") for k in keys)
    assert any(MARK.encode() in p.read_bytes() for p in (run_dir / "wandb").rglob("*.wandb"))  # wandb's offline run
    assert MARK in (run_dir / "csv" / "hparams.yaml").read_text()
    assert MARK in (run_dir / "tensorboard" / "hparams.yaml").read_text()
    said = [ln for ln in r.stdout.splitlines() if "redacted in this run's files and loggers" in ln]
    assert len(said) == (2 if "-m" in overrides else 1) and all(k in said[0] for k in keys), said


# -- the network -----------------------------------------------------------------------------------------------

class Listener:
    """A TCP listener on 127.0.0.1 (an ephemeral port) that counts connections and answers HTTP 401, for as long
    as the test runs (its thread is a daemon, each accept bounded by a timeout)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.requests: list[bytes] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            with conn:
                conn.settimeout(2)
                try:
                    self.requests.append(conn.recv(65536))
                    conn.sendall(b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: 40\r\nConnection: close\r\n\r\n"
                                 b'{"errors":[{"message":"unauthorized"}]}')
                except OSError:
                    pass

    def close(self):
        self.done.set()
        self.thread.join(5)
        self.sock.close()


@pytest.fixture
def listener():
    ln = Listener()
    yield ln
    ln.close()


def url(ln) -> str:
    return f"http://127.0.0.1:{ln.port}"


FILE_VECTORS = {  # name -> (folder/file under --config-dir, its text, extra overrides, the key the error names)
    "wandb online and base_url in an experiment": (
        "experiment/net.yaml", "# @package _global_\nlogger:\n  wandb:\n    mode: online\n    settings:\n"
        "      base_url: {url}\n      api_key: " + "0" * 40 + "\n", ["experiment=net"], "logger.wandb.mode"),
    "base_url in an experiment, online on the command line": (
        "experiment/net.yaml", "# @package _global_\nlogger:\n  wandb:\n    settings:\n      base_url: {url}\n",
        ["experiment=net", "logger.wandb.mode=online"], "logger.wandb.settings.base_url"),
    "a logger group chosen on the command line": (
        "logger/net.yaml", "wandb:\n  _target_: mhalab.training.loggers.WandbLogger\n  save_dir: "
        "${{hydra:runtime.output_dir}}\n  mode: online\n  settings:\n    base_url: {url}\n", ["logger=net"],
        "logger.wandb.mode"),
    "Lightning's WandbLogger online in an experiment": (
        "experiment/net.yaml", "# @package _global_\nlogger:\n  x:\n    _target_: "
        "lightning.pytorch.loggers.wandb.WandbLogger\n    save_dir: ${{hydra:runtime.output_dir}}\n"
        "    mode: online\n    host: {url}\n", ["experiment=net"], "logger.x.mode"),
    "entity in an experiment": (
        "experiment/net.yaml", "# @package _global_\nlogger:\n  wandb:\n    entity: someone-else\n",
        ["experiment=net", "logger.wandb.mode=online"], "logger.wandb.entity"),
    "a sweep's params in an experiment": (
        "experiment/net.yaml", "# @package _global_\nhydra:\n  sweeper:\n    params:\n      logger.wandb.mode: online\n"
        "      +logger.wandb.settings.base_url: {url}\n", ["-m", "experiment=net"], "logger.wandb.mode"),
    "optuna storage postgresql in an experiment": (
        "experiment/net.yaml", "# @package _global_\ndefaults:\n  - override /hydra/sweeper: search\nhydra:\n"
        "  sweeper:\n    storage: postgresql://127.0.0.1:{port}/x\n    n_trials: 1\n", ["-m", "experiment=net"],
        "hydra.sweeper.storage"),
    "optuna storage mysql on the command line": (
        None, "", ["-m", "hydra/sweeper=search", "hydra.sweeper.n_trials=1",
                   "hydra.sweeper.storage=mysql://127.0.0.1:{port}/x"], "hydra.sweeper.storage"),
}


@pytest.mark.proc
@pytest.mark.parametrize("name", list(FILE_VECTORS))
def test_a_setting_that_sends_data_is_refused_from_a_config_file(tmp_path, data_cache, listener, name):
    where, text, overrides, key = FILE_VECTORS[name]
    confdir = tmp_path / "conf"
    confdir.mkdir()
    if where is not None:
        (confdir / where).parent.mkdir(parents=True)
        (confdir / where).write_text(text.format(url=url(listener), port=listener.port))
    r = mhalab(tmp_path, data_cache, "--config-dir", str(confdir),
               *([] if "logger=net" in overrides else ["logger=wandb"]),
               *(o.format(port=listener.port) for o in overrides), timeout=120)
    assert key in refusal(r)
    assert not (tmp_path / "logs").exists()  # refused before anything is written
    assert listener.requests == []


COMMAND_LINE = ["logger=wandb", "logger.wandb.mode=online", "+logger.wandb.settings.base_url={url}",
                f"+logger.wandb.settings.api_key={'0' * 40}", "+logger.wandb.settings.init_timeout=30"]


@pytest.mark.proc
@pytest.mark.parametrize("env", slow_except([{"WANDB_MODE": "offline"}, {"WANDB_DISABLED": "true"}],
                                            keep=[{"WANDB_MODE": "offline"}]))
def test_the_environment_keeps_wandb_offline_whatever_the_command_line_says(tmp_path, data_cache, listener, env):
    r = mhalab(tmp_path, data_cache, *(o.format(url=url(listener)) for o in COMMAND_LINE), env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert listener.requests == []
    (summary,) = (tmp_path / "logs").rglob("summary.json")
    offline = list((summary.parent / "wandb").glob("offline-run-*"))
    assert len(offline) == (1 if env.get("WANDB_MODE") == "offline" else 0)


@pytest.mark.proc
def test_online_from_the_command_line_is_allowed_and_a_wandb_failure_is_one_sentence(tmp_path, data_cache, listener):
    """The command line may send data (the listener is reached); the server refuses the key: one sentence naming
    wandb and what to do, exit status 1, no traceback and no disk advice, the failure recorded in summary.json."""
    import json

    r = mhalab(tmp_path, data_cache, *(o.format(url=url(listener)) for o in COMMAND_LINE))
    assert r.returncode == 1, r.stderr[-3000:]
    assert listener.requests, "wandb online never reached the listener"
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "wandb could not start its run" in errors[0] and "WANDB_MODE=offline" in errors[0]
    assert "Traceback" not in r.stderr + r.stdout and "free space" not in r.stderr
    (summary,) = (tmp_path / "logs").rglob("summary.json")
    assert json.loads(summary.read_text())["error"]["kind"] == "wandb"


# -- the rules themselves (no process) -------------------------------------------------------------------------

def test_only_an_override_of_the_key_or_a_dict_above_it_counts_as_the_command_line():
    from mhalab.config.network import on_command_line

    key = "logger.wandb.settings.base_url"
    assert on_command_line(key, ["+logger.wandb.settings.base_url=http://x"])
    assert on_command_line(key, ["++logger.wandb={settings: {base_url: http://x}}"])
    assert not on_command_line(key, ["logger=wandb"])  # a group picks a file: the file states the value
    assert not on_command_line(key, ["logger.wandb.settings.base_urls=x", "tags=[logger.wandb.settings.base_url]"])


def test_a_key_that_interpolates_an_environment_value_is_redacted_and_the_run_keeps_the_value(monkeypatch):
    from omegaconf import OmegaConf

    from mhalab.config.secrets import Redaction

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("MHALAB_ROOT", "/somewhere")
    cfg = OmegaConf.create({"tags": [ENV, "x"], "seed": 3, "paths": {"root_dir": "${oc.env:MHALAB_ROOT}"},
                            "logger": {"w": {"tags": "${tags}", "name": f"run-{ENV}",
                                             "settings": {"api_key": ENV}}}})
    red = Redaction.of(cfg)
    plain = OmegaConf.to_container(cfg, resolve=True)
    out = red(plain)
    assert out["tags"] == [MARK, "x"] and out["logger"]["w"]["tags"] == [MARK, "x"] and out["seed"] == 3
    assert out["logger"]["w"]["name"] == MARK and out["paths"]["root_dir"] == "/somewhere"
    assert red(plain["logger"], ("logger",), keep=("api_key",))["w"]["settings"]["api_key"] == SECRET
    assert plain["tags"][0] == SECRET  # the data given is not changed: the run keeps the real value
    assert sorted(red.keys()) == ["logger.w.name", "logger.w.settings.api_key", "logger.w.tags.0", "tags.0"]
