"""`python -m fusionlab ...`: the command line (fusionlab.cli), as the `fusionlab` script runs it."""

import sys

from .cli import main

sys.exit(main())
