"""Ranks run as threads of one process: each iterates its own loader, and they agree on
every batch as the feed's gloo group makes them (data/parquet/feed.py `agree_on_batch`:
the first bad rank's line, the sum of the weight sums)."""

import threading
from collections.abc import Callable
from typing import Any

# A rank that stops agreeing (a test's bug) fails the test instead of hanging it.
TIMEOUT_S = 60


class ThreadRanks:
    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._barrier = threading.Barrier(world_size, timeout=TIMEOUT_S)
        self._slots: list[tuple[str | None, float]] = [(None, 0.0)] * world_size

    def agreement(self, rank: int) -> Callable[[str | None, float], tuple[str | None, float]]:
        def agree(message: str | None, weight_sum: float) -> tuple[str | None, float]:
            self._slots[rank] = (message, weight_sum)
            self._barrier.wait()
            lines = [m for m, _ in self._slots if m is not None]
            total = sum(w for _, w in self._slots)
            self._barrier.wait()  # every rank has read the slots before any writes again
            return (lines[0] if lines else None), total

        return agree

    def run(self, work: Callable[[int], Any]) -> list[Any]:
        """``work(rank)`` on every rank at once: what each returned, or the exception it raised."""
        results: list[Any] = [None] * self.world_size

        def one(rank: int) -> None:
            try:
                results[rank] = work(rank)
            except BaseException as e:  # the test looks at it
                results[rank] = e

        threads = [threading.Thread(target=one, args=(r,)) for r in range(self.world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results
