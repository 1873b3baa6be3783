"""``python -m harness.matrix``: the CPU correctness matrix (`harness.matrix.command`)."""

import sys

from harness.matrix.command import main

if __name__ == "__main__":
    sys.exit(main())
