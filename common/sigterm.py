"""SIGTERM as an exception (``Terminated``), where the main thread can take it, and held
back where an exception would be mishandled. Used by training (a rank reports the step
it was stopped at) and by the checkpoint writer (a save stopped mid-write).
"""

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


class Terminated(Exception):
    """SIGTERM arrived: a scheduler stops the job, or torchrun the ranks left behind."""


@contextlib.contextmanager
def raise_on_sigterm() -> Iterator[None]:
    """Inside the block, SIGTERM raises ``Terminated`` in the main thread, so that the
    rank reports the step it was at. A rank blocked inside a collective sees it when
    the call returns. Elsewhere (other threads) this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated("received SIGTERM")


@contextlib.contextmanager
def sigterm_deferred() -> Iterator[None]:
    """Inside the block, a SIGTERM is noted; it takes effect (``Terminated`` inside
    `raise_on_sigterm`) when the block ends. For a block where an exception would be
    mishandled: raised into ``Thread.join``, it marks the running thread as stopped
    (CPython 3.11), the interpreter exits under it, and the process aborts ("terminate
    called without an active exception", exit 134); raised inside torch.save's
    writes, it becomes torch's RuntimeError "unexpected pos A vs B". Elsewhere than in
    the main thread this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if received:
            signal.raise_signal(signal.SIGTERM)  # to the handler of the block's caller
