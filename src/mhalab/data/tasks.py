"""Your own data task: subclass `Task`, name it in your config, allow its package.

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

from mhalab.data.config import TaskInfo


class Task:
    """A data task: `info` says what it is (objective, classes, default tokenizer); `load` gives its text."""

    info: TaskInfo = TaskInfo(objective="classification", source="user")

    def load(self, cfg):
        """Raw splits as a `datasets.DatasetDict`: "train" (required), optionally "validation" and "test", each
        with a `text` column and, for classification, a `label` column (ids or names)."""
        raise NotImplementedError
