"""``python -m tide.cli``: the same as the ``tide`` console script."""

import sys

from tide.cli import main

sys.exit(main())
