"""`python -m mhalab.bench ...` is `mhalab bench ...`."""

import sys

from mhalab.bench import main

sys.exit(main())
