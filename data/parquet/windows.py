"""The values of ``--validation_window`` and ``--test_window``: a duration or a fraction.

A duration is a number and a unit: ``1d``, ``6h``, ``30m``, ``90s`` (days, hours,
minutes, seconds; ``1.5d`` allowed); a fraction is a number between 0 and 1 such as
``0.1``. With ``--time_column`` a fraction is a fraction of the time range; without it
a fraction of the rows (durations need a time column).

Imports neither pyarrow nor torch: the flags are checked without them.
"""

import re
from dataclasses import dataclass

from common.config_flags import FlagError

MICROSECONDS = {"d": 86_400_000_000, "h": 3_600_000_000, "m": 60_000_000, "s": 1_000_000}
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)([dhms])\Z")


@dataclass(frozen=True)
class Window:
    """One split's window: ``microseconds`` for a duration, else ``fraction``."""

    text: str
    microseconds: int | None = None
    fraction: float | None = None

    @property
    def is_duration(self) -> bool:
        return self.microseconds is not None


def parse_window(text: str, option: str) -> Window:
    """The window ``text`` means.

    Raises:
        FlagError: ``"--test_window x: ..."`` when it is neither a positive duration
            nor a fraction strictly between 0 and 1.
    """
    match = _DURATION.match(text.strip())
    if match:
        microseconds = int(round(float(match.group(1)) * MICROSECONDS[match.group(2)]))
        if microseconds <= 0:
            raise FlagError(f"{option} {text}: a duration must be positive")
        return Window(text, microseconds=microseconds)
    try:
        fraction = float(text)
    except ValueError:
        raise FlagError(f"{option} {text}: give a duration (1d, 6h, 30m, 90s) or a fraction (0.1)") from None
    if not 0 < fraction < 1:
        raise FlagError(f"{option} {text}: a fraction must be between 0 and 1 (exclusive)")
    return Window(text, fraction=fraction)
