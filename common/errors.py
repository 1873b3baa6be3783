"""The exception types whose message says all: bad input, and a rank's failure.

``BadInput`` (and its subclasses) means: what the user handed us (a flag, a file, a
line of data) is wrong, the message says what and where, and a retry will not help.
Every CLI turns it into one line on stderr and exit code 2. Any other exception,
a ``ValueError`` from inside torch or torchrec included, is a failure and is
reported with its traceback.

``RankError`` is a failure of one rank (a full disk, say) that its message explains
whole: training reports it, like bad input, in one line without a traceback.

Example::

    raise BadInput(f"{path}:{line}:{column}: expected an integer, got {text!r}")
"""

# The exit code of bad input (see training/failures.py for all of them).
EXIT_BAD_INPUT = 2


class BadInput(Exception):
    """What the user handed us is wrong; the message says what and where."""


class RankError(RuntimeError):
    """A rank failure whose message says all there is to say (a full disk, say): reported
    in one line, without a traceback (training/failures.py)."""
