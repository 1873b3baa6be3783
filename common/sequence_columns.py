"""``--sequence_columns HIST:ITEM``: a history feature and the candidate feature whose
embedding table it shares, parsed once for the data flags and the model's config.

Imports no torch: the flags check it before torch loads.
"""

from common.config_flags import FlagError


def parse_sequence_columns(values: list[str] | None, flag_name: str = "--sequence_columns") -> list[tuple[str, str]]:
    """[(history feature, item feature)] of ``values``, each "HIST:ITEM", several pairs
    per value when comma-separated (``h1:i1,h2:i2``), in the order given.

    Raises:
        FlagError: a value is not HIST:ITEM, or a history is named twice.

    Example::

        parse_sequence_columns(["movie_history:movie"])  # [("movie_history", "movie")]
    """
    pairs: list[tuple[str, str]] = []
    for value in values or []:
        for text in value.split(","):
            history, sep, item = text.strip().partition(":")
            if not sep or not history or not item or ":" in item:
                raise FlagError(f"{flag_name} takes HIST:ITEM (a history column and its item column), got {text!r}")
            if history == item:
                raise FlagError(f"{flag_name} {text}: the history and the item are one column")
            if history in (h for h, _ in pairs):
                raise FlagError(f"{flag_name} names history {history!r} twice")
            pairs.append((history, item))
    return pairs
