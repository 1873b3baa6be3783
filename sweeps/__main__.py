"""``python -m sweeps run|report|status``: see ``sweeps.cli``."""

import sys

from sweeps.cli import main

if __name__ == "__main__":
    sys.exit(main())
