"""mhalab: an experiment framework for multi-head attention."""

from mhalab.errors import ConfigError

__version__ = "0.1.0"
__all__ = ["ConfigError", "__version__"]
