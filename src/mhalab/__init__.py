"""mhalab: an experiment framework for multi-head attention.

The public names are importable from here (`from mhalab import MultiHeadAttention, run_with_cache, open_run`);
each is imported on first use, so `import mhalab` (and `mhalab <command> --help`) does not import torch.
"""

import os as _os
import sys as _sys

# `python -m mhalab ...` puts the current directory first on the import path, so a `yaml.py` or a `hydra_plugins/`
# folder there would run as code when mhalab imports its dependencies: drop it before anything else is imported
# (your own packages come from PYTHONPATH or an install). sys.argv[0] is "-m" only while `-m` locates mhalab.
if _sys.argv[:1] == ["-m"] and _sys.path and _sys.path[0] in ("", _os.getcwd()):
    del _sys.path[0]

from mhalab.errors import ConfigError  # noqa: E402

__version__ = "0.1.0"

_PUBLIC = {  # name -> the module that defines it
    "MultiHeadAttention": "mhalab.attention", "KVCache": "mhalab.attention",
    "build_model": "mhalab.model", "SequenceClassifier": "mhalab.model", "LanguageModel": "mhalab.model",
    "Architecture": "mhalab.architecture",
    "run_with_cache": "mhalab.hooks", "run_with_hooks": "mhalab.hooks",
    "act_name": "mhalab.hooks", "hook_names": "mhalab.hooks", "ActivationCache": "mhalab.hooks",
    "head_stats": "mhalab.head_statistics", "head_importance": "mhalab.head_statistics",
    "HeadStatistic": "mhalab.head_statistics",
    "detector_scores": "mhalab.head_statistics",
    "zero_heads": "mhalab.analysis.ablate", "MeanAblation": "mhalab.analysis.ablate",
    "patch_heads": "mhalab.analysis.patching", "patch": "mhalab.analysis.patching",
    "open_run": "mhalab.analysis.run", "Run": "mhalab.analysis.run",
    "load_module": "mhalab.training.checkpoint",
}
__all__ = ["ConfigError", "__version__", *_PUBLIC]


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'mhalab' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
