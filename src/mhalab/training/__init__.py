"""Training with Lightning: the `mhalab train` job (`train`), the LightningModule (`module`), callbacks (head
statistics, progress, checkpoints), loggers, evaluation, atomic checkpoints and what the console shows."""
