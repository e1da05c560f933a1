"""The life of a run: the preflight, run directories, resuming and locks (`preflight`), the summary.json contract
(`summary`), signals and stopping (`stopping`), SLURM (`slurm`) and the fault points the resume tests kill at
(`faults`)."""
