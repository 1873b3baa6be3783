"""The Criteo feature transforms and vocabulary, shared by preprocessing and serving.

Preprocessing (``python -m data.preprocess_criteo``) applies them to every raw line it
writes; the predictor (``serving/predict.py``) applies the same ones to the raw lines
it is given, so that a served model sees its training inputs:

- dense: missing values arrive as 0, then log(max(x, 0) + 3);
- categorical: a 32-bit hash, then its position in the vocabulary (+1; 0 for a hash
  that is not in it) when the data was made with a frequency threshold, else its low
  31 bits; then modulo the table sizes when they were given.

Example::

    dense = transform_dense(np.array([[5, -1, 0]]))
    ids = transform_sparse(np.array([[0xDEADBEEF]], np.uint32), read_vocabulary(path, 1), None)
"""

from typing import BinaryIO

import numpy as np

DENSE_OFFSET = 3.0
VOCABULARY_FILE = "vocabulary.npz"
RAW_ID_MASK = np.uint32(0x7FFF_FFFF)


def transform_dense(dense_raw: np.ndarray) -> np.ndarray:
    """log(max(x, 0) + 3) as float32; missing values arrive as 0."""
    return np.log(np.maximum(dense_raw, 0).astype(np.float64) + DENSE_OFFSET).astype(np.float32)


def transform_sparse(
    sparse_hash: np.ndarray, vocabulary: list[np.ndarray] | None, sizes: np.ndarray | None
) -> np.ndarray:
    """Hashes -> int32 ids: vocabulary positions (+1, 0 for the rest), else low 31 bits;
    then modulo the table sizes when given."""
    if vocabulary is not None:
        ids = np.empty(sparse_hash.shape, dtype=np.int64)
        for f, vocab in enumerate(vocabulary):
            pos = np.searchsorted(vocab, sparse_hash[:, f])
            found = pos < len(vocab)
            found[found] = vocab[pos[found]] == sparse_hash[found, f]
            ids[:, f] = np.where(found, pos + 1, 0)
    else:
        ids = (sparse_hash & RAW_ID_MASK).view(np.int32)  # < 2**31: same bits as int32
    if sizes is not None:
        ids = ids % sizes
    return ids.astype(np.int32, copy=False)


def _array_name(feature: int) -> str:
    return str(feature)


def vocabulary_arrays(vocabulary: list[np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays of vocabulary.npz: feature f's sorted kept hashes under the name "f"."""
    return {_array_name(f): hashes for f, hashes in enumerate(vocabulary)}


def read_vocabulary(file: str | BinaryIO, num_features: int) -> list[np.ndarray]:
    """Each feature's kept hashes from a vocabulary.npz (pickled arrays are refused).

    Raises OSError, ValueError, KeyError or zipfile.BadZipFile when the file is not one.
    """
    with np.load(file) as saved:
        return [saved[_array_name(f)] for f in range(num_features)]
