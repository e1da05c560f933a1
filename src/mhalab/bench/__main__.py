"""`python -m mhalab.bench ...` is `mhalab bench ...`."""

import sys

from mhalab.cli import main

main(["bench", *sys.argv[1:]])
