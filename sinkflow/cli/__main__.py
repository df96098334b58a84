"""``python -m sinkflow.cli``: the ``sinkflow`` console script."""

import sys

from sinkflow.cli import main

sys.exit(main())
