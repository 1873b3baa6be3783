"""``python -m training.quality_gate``: runs ``python -m serving.quality_gate`` under its old name for one release."""

import sys

from serving.quality_gate import main

sys.exit(main(alias=True))
