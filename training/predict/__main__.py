"""``python -m training.predict``: runs ``python -m serving.predict`` under its old name for one release."""

import sys

from serving.predict import main

sys.exit(main(alias=True))
