"""``python -m torchrl_swm ...``: the ``torchrl-swm`` command (see :mod:`torchrl_swm.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
