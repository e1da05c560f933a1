"""Data: tasks as Hugging Face ``datasets`` wrapped in a Lightning data module.

``build_datamodule(cfg)`` is the entry point; ``conf/data/*.yaml`` lists every key.
"""

from mhalab.data.config import TASKS, DataConfig
from mhalab.data.datamodule import TextDataModule, build_datamodule

__all__ = ["TASKS", "DataConfig", "TextDataModule", "build_datamodule"]
