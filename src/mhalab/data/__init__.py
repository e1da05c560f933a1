"""Data: tasks as Hugging Face ``datasets`` wrapped in a Lightning data module.

``build_datamodule(cfg)`` is the entry point; ``mhalab.data.config.DataConfig`` lists every key. Importing this
package stays light (no torch or Lightning) so that configs can be checked quickly.
"""

from mhalab.data.config import DataConfig
from mhalab.data.tasks import TASKS

__all__ = ["TASKS", "DataConfig", "TextDataModule", "build_datamodule"]


def __getattr__(name: str):
    if name in ("TextDataModule", "build_datamodule"):
        from mhalab.data import datamodule

        return getattr(datamodule, name)
    raise AttributeError(f"module 'mhalab.data' has no attribute {name!r}")
