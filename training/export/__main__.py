"""``python -m training.export``: runs ``python -m serving.export`` under its old name for one release."""

import sys

from serving.export import main

sys.exit(main(alias=True))
