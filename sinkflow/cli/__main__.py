"""``python -m sinkflow.cli``: the ``sinkflow`` console script."""

import sys

from sinkflow.cli import main

if __name__ == "__main__":
    sys.exit(main())
