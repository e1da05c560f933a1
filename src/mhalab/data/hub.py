"""Tasks downloaded from the Hugging Face Hub with ``datasets.load_dataset``, failing fast when offline.

Without a network ``load_dataset`` retries for about 25 s before it gives up.  So we decide first:
offline if ``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set or ``HF_ENDPOINT`` (default
https://huggingface.co) cannot be reached within ``CONNECT_TIMEOUT_S``.  Offline, ``load_dataset`` runs in
the library's offline mode: a dataset already in the cache still loads, anything else fails at once.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from urllib.parse import urlparse

import datasets
import huggingface_hub.constants
from datasets import DatasetDict

from mhalab.errors import ConfigError

CONNECT_TIMEOUT_S = 3.0
OFFLINE_ALTERNATIVES = "data=bbc_news, data=bbc_news_mlm, data=listops, or data.path=<local file>"
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


def offline_by_env() -> bool:
    """True when the environment asks for offline mode (read now, not at import time)."""
    return any(os.environ.get(v, "").upper() in {"1", "ON", "YES", "TRUE"} for v in OFFLINE_VARIABLES)


def hub_reachable(timeout: float = CONNECT_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the Hub endpoint opens within ``timeout`` seconds.

    The check runs in a daemon thread so that a hanging DNS lookup cannot block us either.
    """
    url = urlparse(os.environ.get("HF_ENDPOINT") or huggingface_hub.constants.ENDPOINT)
    address = (url.hostname, url.port or (443 if url.scheme == "https" else 80))
    result: list[bool] = []

    def connect() -> None:
        try:
            socket.create_connection(address, timeout=timeout).close()
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


@contextlib.contextmanager
def offline_mode(enabled: bool) -> Iterator[None]:
    """Switch ``datasets`` and ``huggingface_hub`` to offline mode for the duration (no-op if not enabled)."""
    if not enabled:
        yield
        return
    saved = datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE = saved


def load_hub(task: str, repo: str, config: str | None, hf_cache_dir: str | None) -> DatasetDict:
    """``load_dataset(repo, config)``; offline and not cached raises ConfigError naming the alternatives."""
    cache = str(hf_cache_dir or datasets.config.HF_DATASETS_CACHE)
    offline = offline_by_env() or not hub_reachable()
    try:
        with offline_mode(offline):
            return datasets.load_dataset(repo, config, cache_dir=cache)
    except Exception as e:
        if not (offline or isinstance(e, (ConnectionError, TimeoutError))):
            raise
        why = "offline mode is set" if offline_by_env() else "the Hub cannot be reached"
        raise ConfigError(
            f"data.task={task} needs the Hub dataset {repo}{'/' + config if config else ''}, which is not in the "
            f"cache {cache} and {why}; offline use {OFFLINE_ALTERNATIVES}."
        ) from e

