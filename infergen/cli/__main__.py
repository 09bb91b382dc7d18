"""`python -m infergen.cli ...`: the same as the `infergen` command."""

import sys

from infergen.cli import main

sys.exit(main())
