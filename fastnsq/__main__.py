"""``python -m fastnsq``: the ``fastnsq`` command (see :mod:`fastnsq.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
