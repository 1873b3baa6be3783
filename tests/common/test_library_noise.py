"""Benign library messages are silenced by their exact text; anything else still shows."""

import logging
import warnings

from common.library_noise import BENIGN_MESSAGES, quiet_benign_library_messages


def test_each_benign_message_is_silenced_and_a_reworded_one_is_not(caplog):
    quiet_benign_library_messages()
    quiet_benign_library_messages()  # idempotent: the entry points may both call it
    for entry in BENIGN_MESSAGES:
        suffix = " (Triggered internally at /some/build/path.cpp:76.)" if entry.then_varies else ""
        if entry.category is not None:
            with warnings.catch_warnings(record=True) as caught:
                # Our filters, then "always" for everything else (instead of the interpreter's once-per-place).
                warnings.filters[:] = [
                    f for f in warnings.filters if f[0] == "ignore" and f[1] is not None and f[1].pattern != ""
                ]
                warnings.simplefilter("always", append=True)
                warnings.warn(entry.text + suffix, entry.category, stacklevel=1)
                warnings.warn("something else: " + entry.text, entry.category, stacklevel=1)
            assert [str(w.message) for w in caught] == ["something else: " + entry.text], entry.text
        if entry.logger is not None:
            logger = logging.getLogger(entry.logger)
            caplog.clear()
            with caplog.at_level(logging.WARNING):
                logger.warning(entry.text)
                logger.warning("%s", entry.text + " and more")
            assert [r.getMessage() for r in caplog.records] == [entry.text + " and more"], entry.text
