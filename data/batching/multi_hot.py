"""Multi-hot categorical features: on-the-fly expansion and the MLPerf DLRM-DCNv2 layout.

On the fly (``--multi_hot_sizes``): a one-hot id x of a table with N rows becomes the
bag ``[x, (x + o_1) % N, ..., (x + o_{k-1}) % N]`` whose offsets o_j are looked up
from a per-feature table drawn from the seed, at row ``x % 65536``. The bag is thus a
fixed function of the id: identical on every rank, in every epoch, whatever the
batch. Offsets are uniform over the table ("uniform") or heavy-tailed near the id
("pareto": 1 + floor(N / 1000 * Pareto(1.0)), so bags mostly hold nearby rows).

On disk (``--synthetic_multi_hot_criteo_path``): per day ``day_{i}_sparse_multi_hot.npz``
holding 26 int32 arrays of shape (N, hotness_k) under keys "0" .. "25", beside the
usual ``day_{i}_dense.npy`` and ``day_{i}_labels.npy``. Members stored without
compression are memory-mapped; compressed ones are read whole.
"""

import zipfile
from collections.abc import Sequence

import numpy as np

from common.atomic import atomic_path
from common.errors import BadInput
from data.sources.types import MULTI_HOT_DISTRIBUTIONS

_OFFSET_ROWS = 65536


class MultiHotExpander:
    """Turns one-hot ids (B, F) into per-feature bags [(B, k_f)].

    Args:
        hotness: bag size per feature (1 keeps the feature one-hot).
        num_embeddings_per_feature: table sizes, the range of the bag's ids.
        distribution: "uniform" or "pareto".
        seed: draws the offset tables.

    Example::

        expand = MultiHotExpander([3] * 26, [1000] * 26, "uniform", seed=0)
        bags = expand(np.zeros((4, 26), np.int32))  # 26 arrays of shape (4, 3)
    """

    def __init__(
        self, hotness: Sequence[int], num_embeddings_per_feature: Sequence[int], distribution: str, seed: int
    ) -> None:
        if distribution not in MULTI_HOT_DISTRIBUTIONS:
            raise BadInput(f"--multi_hot_distribution_type must be uniform or pareto, got {distribution!r}")
        self.hotness = list(hotness)
        self.sizes = np.asarray(num_embeddings_per_feature, dtype=np.int64)
        self._offsets: list[np.ndarray] = []
        for f, (k, n) in enumerate(zip(self.hotness, self.sizes)):
            rng = np.random.default_rng([seed, 7919, f])
            shape = (_OFFSET_ROWS, max(k - 1, 0))
            if distribution == "uniform":
                offsets = rng.integers(1, max(int(n), 2), size=shape)
            else:
                offsets = 1 + np.floor(rng.pareto(1.0, size=shape) * max(int(n) / 1000, 1.0))
            self._offsets.append(np.minimum(offsets, np.iinfo(np.int64).max // 4).astype(np.int64))

    def __call__(self, sparse: np.ndarray) -> list[np.ndarray]:
        bags = []
        for f, k in enumerate(self.hotness):
            ids = sparse[:, f].astype(np.int64)
            if k == 1:
                bags.append(sparse[:, f : f + 1].astype(np.int32))
                continue
            others = (ids[:, None] + self._offsets[f][ids % _OFFSET_ROWS]) % self.sizes[f]
            bags.append(np.concatenate([ids[:, None], others], axis=1).astype(np.int32))
        return bags


def open_npz_arrays(path: str, keys: Sequence[str]) -> list[np.ndarray]:
    """The named arrays of an .npz: memory-mapped when stored uncompressed, else loaded."""
    arrays = []
    with zipfile.ZipFile(path) as archive:
        for key in keys:
            name = f"{key}.npy"
            try:
                info = archive.getinfo(name)
            except KeyError:
                raise BadInput(f"{path}: no array {key!r} (expected keys 0..{len(keys) - 1})") from None
            if info.compress_type != zipfile.ZIP_STORED:
                with archive.open(info) as member:
                    arrays.append(np.lib.format.read_array(member))
                continue
            with open(path, "rb") as f:
                f.seek(info.header_offset)
                local = f.read(30)
                data_start = (
                    info.header_offset
                    + 30
                    + int.from_bytes(local[26:28], "little")
                    + int.from_bytes(local[28:30], "little")
                )
                f.seek(data_start)
                version = np.lib.format.read_magic(f)
                read_header = (
                    np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                )
                shape, fortran, dtype = read_header(f)
                offset = f.tell()
            if fortran:
                raise BadInput(f"{path}: array {key!r} is Fortran-ordered; expected C order")
            arrays.append(np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape))
    return arrays


def write_multi_hot_npz(path: str, bags: Sequence[np.ndarray]) -> None:
    """Writes 26 (N, k_f) int32 arrays under keys "0".."25", uncompressed, atomically."""
    with atomic_path(path, suffix=".tmp.npz") as tmp:
        np.savez(tmp, **{str(f): np.ascontiguousarray(b, dtype=np.int32) for f, b in enumerate(bags)})
