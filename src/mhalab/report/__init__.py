"""Sweep reports: the `mhalab report` command (`report.command`) reads runs into arms (`report.runs`, `report.arms`),
compares them with the baseline and draws the pictures (`report.figures`)."""
