"""Keeps a memory-mapped loader's resident set bounded on data larger than memory.

Every page of a memory-mapped file that a process has read stays mapped into it, and
so counts in its RSS, until the mapping goes away: a loader that reads a 30 GB data
set through ``np.memmap`` ends up with the whole data set in its RSS (clean pages the
kernel could reclaim, but they count against memory limits and crowd out other
memory). `MappedPageRelease` unmaps them with ``madvise(MADV_DONTNEED)`` every
``every_bytes`` of mapped data read. The pages stay in the page cache (a read-only
shared mapping loses nothing), so a batch read again later faults them back in from
there, or from the disk once the kernel has evicted them; values never change.

Example::

    release = MappedPageRelease([vf.array for vf in dataset.value_files()], every_bytes=64 << 20)
    for batch in batches:
        release.count(batch_bytes)
"""

import mmap
from collections.abc import Sequence

import numpy as np

# Mapped bytes a loader reads between releases: its RSS grows by at most about this
# much (plus the kernel's read-ahead around the last batch), at the cost of one
# madvise call per 64 MiB.
RELEASE_EVERY_BYTES = 64 << 20


def file_mappings(arrays: Sequence[np.ndarray]) -> list[mmap.mmap]:
    """The distinct memory maps behind ``arrays`` (``np.memmap`` / ``np.load(mmap_mode=...)``
    arrays and views of them); arrays in memory have none."""
    found: dict[int, mmap.mmap] = {}
    for array in arrays:
        mapping = getattr(array, "_mmap", None)  # np.memmap keeps its map there, views too
        if mapping is not None:
            found[id(mapping)] = mapping
    return list(found.values())


def prefetch_rows(array: np.ndarray, start: int, stop: int) -> None:
    """Asks the kernel to read rows ``start .. stop`` of a memory-mapped array now, in
    one request per array (``MADV_WILLNEED``); a no-op for arrays in memory. With the
    mapping's read-ahead off (`MappedPageRelease.random_order`), batches read in random
    order cost one disk request each instead of one per page or a read-ahead window."""
    mapping = getattr(array, "_mmap", None)
    if mapping is None or stop <= start:
        return
    first = array.offset % mmap.ALLOCATIONGRANULARITY + start * array.strides[0]  # where the rows are in the map
    aligned = first - first % mmap.PAGESIZE
    mapping.madvise(mmap.MADV_WILLNEED, aligned, first + (stop - start) * array.strides[0] - aligned)


class MappedPageRelease:
    """Unmaps the read pages of a data set's memory maps every ``every_bytes`` read.

    Args:
        arrays: the data set's arrays; those that are memory-mapped are released.
        every_bytes: mapped bytes read between two releases.
        random_order: the batches are read in random order: turns the kernel's
            read-ahead around each page fault off (``MADV_RANDOM``), which would read
            a whole read-ahead window (megabytes) for every batch's few pages.

    Example::

        release = MappedPageRelease(arrays, every_bytes=RELEASE_EVERY_BYTES)
        release.count(dense.nbytes + sparse.nbytes + labels.nbytes)
    """

    def __init__(
        self, arrays: Sequence[np.ndarray], every_bytes: int = RELEASE_EVERY_BYTES, random_order: bool = False
    ) -> None:
        self._mappings = file_mappings(arrays)
        self._every = every_bytes
        self._read = 0
        if random_order:
            for mapping in self._mappings:
                mapping.madvise(mmap.MADV_RANDOM)

    def count(self, nbytes: int) -> None:
        """Records ``nbytes`` of mapped data read; releases once ``every_bytes`` are reached."""
        self._read += nbytes
        if self._read >= self._every:
            self.release()

    def release(self) -> None:
        """Unmaps every page of the mappings now (they stay in the page cache)."""
        for mapping in self._mappings:
            if not mapping.closed:
                mapping.madvise(mmap.MADV_DONTNEED)
        self._read = 0
