"""Entry point for ``python -m coclr`` (and ``torchrun -m coclr``)."""

import sys

from coclr.cli import main

if __name__ == "__main__":
    sys.exit(main())
