"""`python -m bot.localforge`: the same as `vaultmail forge`."""

import sys

from .cli import main

sys.exit(main())
