"""``python -m training.serve``: runs ``python -m serving.serve`` under its old name for one release."""

import sys

from serving.serve import main

sys.exit(main(alias=True))
