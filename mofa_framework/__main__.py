"""``python -m mofa_framework``: the ``mofa`` command line."""

import sys

from mofa_framework.cli import main

if __name__ == "__main__":
    sys.exit(main())
