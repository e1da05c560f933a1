"""`python -m mhalab.report ...` is `mhalab report ...`."""

import sys

from mhalab.cli import main

main(["report", *sys.argv[1:]])
