"""`python -m infergen …` (and `torchrun … -m infergen serve …`): the command line."""

import sys

from infergen.cli.main import main

sys.exit(main())
