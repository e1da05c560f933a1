"""Data tasks: every built-in task is a `Task` subclass in a module of this folder; yours is one too.

A built-in task is found by its module here: a `Task` subclass with a `name` (its `data.task`) is registered in
`TASKS`, and its `settings` dataclass (if any) becomes the `data.<name>` node of `mhalab.data.config.DataConfig`.
Adding one is adding a module (and, for `data=<name>`, a conf/data/<name>.yaml).

Your own task: subclass `Task`, name it in your config, allow its package.

    # mytasks.py
    from datasets import Dataset, DatasetDict
    from mhalab.data.config import TaskInfo
    from mhalab.data.tasks import Task

    class Parity(Task):
        info = TaskInfo(objective="classification", source="user", label_names=("even", "odd"))

        def __init__(self, n: int = 2000):
            self.n = n

        def load(self, cfg) -> DatasetDict:
            texts = [format(i, "b") for i in range(self.n)]
            return DatasetDict({"train": Dataset.from_dict({"text": texts, "label": [t.count("1") % 2 for t in texts]})})

    # myconf/data/parity.yaml
    task: parity
    tokenizer: byte
    source:
      _target_: mytasks.Parity
      n: 4000

    mhalab train --allow mytasks --config-dir myconf data=parity

`load(cfg)` returns raw splits with a `text` column (and an integer or string `label` column for
classification): the splits it does not give are carved out of `train` (`data.val_fraction`,
`data.test_fraction`), then everything is tokenized, cached and served like a built-in task. The data config
(`cfg`, a `mhalab.data.config.DataConfig`) is passed in for its seed and sizes. Importing your module is your
explicit choice: `--allow mytasks` or `MHALAB_ALLOW=mytasks` on each command that builds the task (train, and
plots, ablate, convert reading the run back; mhalab.targets) admits it, nothing else does.
"""

from __future__ import annotations

import importlib
import pkgutil

from mhalab.data.tasks.base import Task, TaskInfo

__all__ = ["TASKS", "Task", "TaskInfo"]


def _built_in() -> dict[str, type[Task]]:
    """data.task name -> Task subclass, for every named subclass defined in a module of this folder."""
    found: dict[str, type[Task]] = {}
    for module_info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, Task) and obj.__module__ == module.__name__ and obj.name:
                if obj.name in found:
                    raise RuntimeError(f"two built-in tasks are named {obj.name!r}: {found[obj.name]} and {obj}")
                found[obj.name] = obj
    return dict(sorted(found.items()))


TASKS: dict[str, type[Task]] = _built_in()
