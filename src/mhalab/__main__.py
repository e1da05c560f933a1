"""`python -m mhalab <command> ...` is `mhalab <command> ...`."""

from mhalab.cli import main

main()
