"""`python -m flows.cli`: the `embforge` command."""

import sys

from flows.cli import main

sys.exit(main())
