"""`python -m localforge`: the same as `vaultmail forge`."""

import sys

from .cli import main

sys.exit(main())
