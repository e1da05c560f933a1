"""What the heads of a trained model do: head statistics and importance (`head_stats`), a finished run in Python
(`run.open_run`), activation patching (`patching`), the `ablate`, `convert` and `plots` commands."""
