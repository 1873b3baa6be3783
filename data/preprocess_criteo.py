"""Raw Criteo click logs -> the in-memory binary layout, streaming with bounded memory.

    python -m data.preprocess_criteo --input_dir RAW --output_dir OUT \\
        --dataset_name criteo_1t|criteo_kaggle [--frequency_threshold T] \\
        [--num_embeddings_per_feature 40000000,39060,...] [--workers N] \\
        [--on_bad_lines error|skip] [--vocabulary TRAINING_DATA_DIR]

Input: criteo_1t, a directory of day files ``day_0`` ... ``day_23`` (each plain or
``.gz``); criteo_kaggle, a directory holding ``train.txt`` (or ``train.txt.gz``),
which is cut into ``--kaggle_days`` (7) day files of consecutive lines, as equal
as possible (the Kaggle file is 7 days of traffic in time order).

Output per day i: ``day_{i}_dense.npy`` float32 (N, 13), ``day_{i}_sparse.npy``
int32 (N, 26), ``day_{i}_labels.npy`` int32 (N, 1), and ``metadata.json`` with the
per-feature cardinalities (``num_embeddings_per_feature``), rows per day and bad-line
counts. With a frequency threshold, ``vocabulary.npz`` keeps each feature's kept
hashes (id k+1 is the k-th kept hash; 0 is the reserved id).

Transforms: missing values -> 0; dense -> log(max(x, 0) + 3), the same offset for
every file; categorical hex -> integer, then either contiguous ids by frequency
(``--frequency_threshold T``: hashes seen fewer than T times over the training days,
or never, map to id 0) or modulo ``--num_embeddings_per_feature`` (applied last in
both cases), or else the hash's low 31 bits.

New days for a model already trained (scoring day N+1 with ``--mode test``, or
training on): ``--vocabulary TRAINING_DATA_DIR`` (the --output_dir of the training
data's run) applies that run's ids: its vocabulary (a hash it did not keep -> id 0),
its frequency threshold and modulo, and its table sizes in metadata.json, so the
checkpoint's tables fit. No vocabulary is counted. The vocabulary is copied into the
output, for ``serving.export``. (The trainer reads two days at least, the last one
its validation and test split: put the new day last.)

Each output is written under a temporary name and renamed when complete; a day's
marker ``day_{i}.done.json`` is written last, so a killed run is resumed by running
the same command again: finished days (same input, same settings, files of the size
the marker's row count gives) are skipped. A run removes what an earlier run into the
same directory left and it does not own: metadata.json until it is rewritten at the
end, day files beyond its own days, and an unused vocabulary. An empty day (no lines,
or only bad ones) is refused.
"""

import dataclasses
import functools
import hashlib
import json
import multiprocessing as mp
import os
import re
import struct
import sys
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field

import numpy as np

from common.atomic import atomic_path, naming_write_errors, write_json
from common.cli import OneLineParser, cli_main
from common.config_flags import flag, parse_flags
from common.errors import BadInput
from data.binary.criteo_layout import (
    METADATA_FILE,
    NUM_DENSE_FEATURES,
    NUM_SPARSE_FEATURES,
    CriteoMetadata,
    day_file,
    done_marker,
    metadata_file,
    read_metadata,
    remove_day_files_from,
    write_metadata,
)
from data.preprocess.criteo_transforms import (
    DENSE_OFFSET,
    VOCABULARY_FILE,
    read_vocabulary,
    transform_dense,
    transform_sparse,
    vocabulary_arrays,
)
from data.text.criteo_tsv import parse_criteo_lines
from data.text.text_lines import DaySource, iter_line_chunks, read_blocks

DATASET_NAMES = ("criteo_1t", "criteo_kaggle")
BAD_LINE_POLICIES = ("error", "skip")
RAW_DAY_FILE = re.compile(r"day_(\d+)(\.gz)?")  # criteo_1t input day files
_NPY_HEADER_BYTES = 128
_DAY_ARRAYS = {
    "dense": (np.float32, NUM_DENSE_FEATURES),
    "sparse": (np.int32, NUM_SPARSE_FEATURES),
    "labels": (np.int32, 1),
}
ProgressFn = Callable[[int, int], None]  # (bytes, lines) just processed


class BadLineError(BadInput):
    """A malformed input line under --on_bad_lines error."""


@dataclass
class PreprocessConfig:
    """What to preprocess and how (the command line's flags); see the module docstring."""

    input_dir: str = flag(
        help="criteo_1t: directory of day_0 ... day_23 (plain or .gz); criteo_kaggle: the "
        "directory holding train.txt (or train.txt.gz)"
    )
    output_dir: str = flag(
        help="directory of the binary layout to write (day_{i}_{dense,sparse,labels}.npy, "
        "metadata.json); running the same command again resumes it"
    )
    dataset_name: str = flag(choices=DATASET_NAMES, help="which Criteo data set the input is")
    frequency_threshold: int = flag(
        0, help="contiguous ids by frequency; hashes seen fewer times over the training days map to id 0 (0: none)"
    )
    num_embeddings_per_feature: list[int] | None = flag(
        None, help="table sizes to take the ids modulo, comma-separated (26 values; default: none)"
    )
    workers: int = flag(1, help="day files processed in parallel")
    on_bad_lines: str = flag(
        "error", choices=BAD_LINE_POLICIES, help="error: stop at the first malformed line; skip: count and skip them"
    )
    chunk_bytes: int = flag(1 << 20, help="bytes of text parsed at a time: bounds each worker's memory")
    kaggle_days: int = flag(7, help="day files the Kaggle train.txt is cut into")
    # None: this run's own vocabulary.
    vocabulary: str | None = flag(
        None,
        metavar="TRAINING_DATA_DIR",
        help="apply the ids of the run that wrote TRAINING_DATA_DIR (its vocabulary, "
        "threshold, modulo and table sizes) to new days",
    )

    def validate(self) -> None:
        if self.vocabulary is not None:
            if self.frequency_threshold or self.num_embeddings_per_feature is not None:
                raise BadInput(
                    "--vocabulary takes the frequency threshold and table sizes of the training run: "
                    "do not give --frequency_threshold or --num_embeddings_per_feature with it"
                )
            if not os.path.isfile(metadata_file(self.vocabulary)):
                raise BadInput(
                    f"--vocabulary {self.vocabulary}: no {METADATA_FILE}; give the --output_dir of "
                    "the preprocess_criteo run that made the training data"
                )
        if self.dataset_name not in DATASET_NAMES:
            raise BadInput(f"--dataset_name must be one of {', '.join(DATASET_NAMES)}, got {self.dataset_name!r}")
        if not os.path.isdir(self.input_dir):
            raise BadInput(f"--input_dir {self.input_dir}: no such directory")
        if self.frequency_threshold < 0:
            raise BadInput(f"--frequency_threshold must not be negative, got {self.frequency_threshold}")
        sizes = self.num_embeddings_per_feature
        if sizes is not None:
            if len(sizes) != NUM_SPARSE_FEATURES:
                raise BadInput(f"--num_embeddings_per_feature needs {NUM_SPARSE_FEATURES} values, got {len(sizes)}")
            if min(sizes) <= 0 or max(sizes) > np.iinfo(np.int32).max:
                raise BadInput("--num_embeddings_per_feature values must be positive int32 numbers")
        if self.workers <= 0:
            raise BadInput(f"--workers must be positive, got {self.workers}")
        if self.on_bad_lines not in BAD_LINE_POLICIES:
            raise BadInput(f"--on_bad_lines must be error or skip, got {self.on_bad_lines!r}")
        if self.chunk_bytes < 1024:
            raise BadInput(f"--chunk_bytes must be at least 1024, got {self.chunk_bytes}")
        if self.kaggle_days < 2:
            raise BadInput(f"--kaggle_days must be at least 2, got {self.kaggle_days}")

    def fingerprint(self) -> str:
        """Identifies the settings that change output values (not workers or chunking)."""
        relevant = {
            k: getattr(self, k)
            for k in (
                "dataset_name",
                "frequency_threshold",
                "num_embeddings_per_feature",
                "on_bad_lines",
                "kaggle_days",
            )
        }
        if self.vocabulary is not None:  # the ids depend on the training run's vocabulary
            relevant["vocabulary"] = self._training_vocabulary_digest
        return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]

    @functools.cached_property
    def _training_vocabulary_digest(self) -> str:
        path = os.path.join(str(self.vocabulary), VOCABULARY_FILE)
        digest = hashlib.sha256()
        if os.path.exists(path):
            for block in read_blocks(path, 1 << 22):
                digest.update(block)
        return digest.hexdigest()


def _training_run(directory: str) -> CriteoMetadata:
    """What --vocabulary takes from the training data's run: its metadata.json's
    frequency threshold, modulo and table sizes (the checkpoint's)."""
    metadata = read_metadata(directory)
    if metadata is None or metadata.num_embeddings_per_feature is None:
        raise BadInput(
            f"{metadata_file(directory)}: records no num_embeddings_per_feature; give the --output_dir "
            "of the preprocess_criteo run that made the training data"
        )
    return metadata


def _count_lines(path: str, chunk_bytes: int) -> int:
    count, last = 0, b"\n"
    for block in read_blocks(path, chunk_bytes):
        count += block.count(b"\n")
        last = block[-1:]
    return count + (last != b"\n")


def discover_sources(config: PreprocessConfig) -> list[DaySource]:
    """The output days and the raw lines each is made from."""
    if config.dataset_name == "criteo_kaggle":
        for name in ("train.txt", "train.txt.gz"):
            path = os.path.join(config.input_dir, name)
            if os.path.exists(path):
                break
        else:
            raise BadInput(f"--input_dir {config.input_dir}: no train.txt or train.txt.gz (criteo_kaggle)")
        total = _count_lines(path, config.chunk_bytes)
        if total < config.kaggle_days:
            raise BadInput(
                f"{path}: {total} lines, fewer than the {config.kaggle_days} days (--kaggle_days) it is cut into"
            )
        bounds = [total * d // config.kaggle_days for d in range(config.kaggle_days + 1)]
        return [DaySource(d, path, bounds[d], bounds[d + 1] - bounds[d], total) for d in range(config.kaggle_days)]
    found: dict[int, str] = {}
    for name in os.listdir(config.input_dir):
        match = RAW_DAY_FILE.fullmatch(name)
        if match:
            day = int(match.group(1))
            if day in found:
                raise BadInput(f"--input_dir {config.input_dir}: day {day} is there both plain and .gz")
            found[day] = os.path.join(config.input_dir, name)
    if not found:
        raise BadInput(f"--input_dir {config.input_dir}: no day_<N> or day_<N>.gz files (criteo_1t)")
    missing = [d for d in range(max(found) + 1) if d not in found]
    if missing:
        raise BadInput(f"--input_dir {config.input_dir}: day files must be day_0 .. day_N; day_{missing[0]} is missing")
    if config.frequency_threshold > 0 and config.vocabulary is None and len(found) < 2:
        raise BadInput(
            "--frequency_threshold counts the training days (all but the last): it needs at least two day files"
        )
    return [DaySource(d, found[d]) for d in sorted(found)]


def _parse_source(
    source: DaySource, config: PreprocessConfig, progress: ProgressFn | None, bad_counts: list[int]
) -> Iterator:
    """Parsed chunks of a source; raises BadLineError or counts bad lines."""
    for first_line, nbytes, lines in iter_line_chunks(source, config.chunk_bytes):
        chunk = parse_criteo_lines(lines)
        if chunk.bad_lines:
            if config.on_bad_lines == "error":
                index, reason = chunk.bad_lines[0]
                raise BadLineError(f"{source.path} line {first_line + index + 1}: {reason}")
            bad_counts[0] += len(chunk.bad_lines)
        if progress:
            progress(nbytes, chunk.num_lines)
        yield chunk


# ---------------------------------------------------------------- counting pass


def _merge_counts(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.concatenate([p[0] for p in parts])
    counts = np.concatenate([p[1] for p in parts])
    unique, inverse = np.unique(ids, return_inverse=True)
    return unique, np.bincount(inverse, weights=counts, minlength=len(unique)).astype(np.int64)


def count_source(
    source: DaySource, config: PreprocessConfig, progress: ProgressFn | None = None
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(sorted hashes, counts) of every categorical feature over one source."""
    state: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(NUM_SPARSE_FEATURES)]
    for n, chunk in enumerate(_parse_source(source, config, progress, [0])):
        for f in range(NUM_SPARSE_FEATURES):
            state[f].append(np.unique(chunk.sparse_hash[:, f], return_counts=True))
        if n % 16 == 15:  # merge now and then: memory follows the distinct hashes, not the input
            state = [[_merge_counts(parts)] for parts in state]
    return [_merge_counts(parts) if parts else (np.zeros(0, np.uint32), np.zeros(0, np.int64)) for parts in state]


# ---------------------------------------------------------------- transform pass


class _NpyWriter:
    """Appends rows to a .npy file whose row count is known only at the end.

    The header has a fixed size and is rewritten with the final shape on close.
    """

    def __init__(self, path: str, dtype: np.dtype, width: int) -> None:
        self.path, self.dtype, self.width, self.rows = path, np.dtype(dtype), width, 0
        with naming_write_errors(self.path):
            self._file = open(path, "wb")
            self._file.write(self._header())

    @staticmethod
    def file_size(rows: int, dtype: np.dtype, width: int) -> int:
        """Bytes of a complete file of ``rows`` rows."""
        return _NPY_HEADER_BYTES + rows * width * np.dtype(dtype).itemsize

    def _header(self) -> bytes:
        text = f"{{'descr': {self.dtype.str!r}, 'fortran_order': False, 'shape': ({self.rows}, {self.width}), }}"
        text = text.ljust(_NPY_HEADER_BYTES - 10 - 1) + "\n"
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin1")

    def append(self, rows: np.ndarray) -> None:
        with naming_write_errors(self.path):
            self._file.write(memoryview(np.ascontiguousarray(rows, dtype=self.dtype)).cast("B"))
        self.rows += len(rows)

    def close(self) -> None:
        with naming_write_errors(self.path):
            self._file.seek(0)
            self._file.write(self._header())
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()

    def discard(self) -> None:
        """Closes the unfinished file (its unwritten buffer is dropped; atomic_path removes it)."""
        try:
            self._file.close()
        except OSError:
            pass  # the buffered bytes that could not be written: the file goes anyway


@dataclass
class DayResult:
    day: int
    rows: int
    bad_lines: int
    max_ids: list[int] = field(default_factory=list)


def transform_source(
    source: DaySource, config: PreprocessConfig, vocabulary: list[np.ndarray] | None, progress: ProgressFn | None = None
) -> DayResult:
    """Writes one day's three files (temporary names, renamed when complete)."""
    with ExitStack() as renamed_when_complete:
        tmp = {
            kind: renamed_when_complete.enter_context(atomic_path(day_file(config.output_dir, source.day, kind)))
            for kind in _DAY_ARRAYS
        }
        writers = {kind: _NpyWriter(tmp[kind], dtype, width) for kind, (dtype, width) in _DAY_ARRAYS.items()}
        return _transform_into(source, config, vocabulary, progress, writers)


def _transform_into(
    source: DaySource,
    config: PreprocessConfig,
    vocabulary: list[np.ndarray] | None,
    progress: ProgressFn | None,
    writers: dict[str, "_NpyWriter"],
) -> DayResult:
    """Fills the day's writers; BadInput when no line gives a row."""
    sizes = None if config.num_embeddings_per_feature is None else np.asarray(config.num_embeddings_per_feature)
    bad = [0]
    max_ids = np.zeros(NUM_SPARSE_FEATURES, dtype=np.int64)
    try:
        for chunk in _parse_source(source, config, progress, bad):
            sparse = transform_sparse(chunk.sparse_hash, vocabulary, sizes)
            if len(sparse):
                max_ids = np.maximum(max_ids, sparse.max(axis=0))
            writers["dense"].append(transform_dense(chunk.dense_raw))
            writers["sparse"].append(sparse)
            writers["labels"].append(chunk.labels.reshape(-1, 1))
        for writer in writers.values():
            writer.close()
    except BaseException:
        for writer in writers.values():
            writer.discard()
        raise
    rows = writers["labels"].rows
    if rows == 0:
        where = source.path if source.num_lines is None else f"{source.path} (day {source.day})"
        what = f"all {bad[0]} lines are bad (--on_bad_lines skip)" if bad[0] else "no lines"
        raise BadInput(f"{where}: {what}; every day needs rows (the last one is validation and test)")
    return DayResult(source.day, rows, bad[0], max_ids.tolist())


# ---------------------------------------------------------------- orchestration


def _finished(config: PreprocessConfig, source: DaySource) -> DayResult | None:
    """The recorded result of a day already written with these settings, if any."""
    try:
        with open(done_marker(config.output_dir, source.day)) as f:
            marker = json.load(f)
    except (OSError, json.JSONDecodeError):
        return None
    if marker.get("fingerprint") != config.fingerprint() or marker.get("source") != source.signature():
        return None
    rows = marker["rows"]
    for kind, (dtype, width) in _DAY_ARRAYS.items():
        path = day_file(config.output_dir, source.day, kind)
        if not os.path.exists(path) or os.path.getsize(path) != _NpyWriter.file_size(rows, dtype, width):
            return None  # missing or truncated since: written again
    return DayResult(source.day, rows, marker["bad_lines"], marker["max_ids"])


class _Progress:
    """tqdm over input bytes with a lines/s figure, fed from this or worker processes."""

    def __init__(self, total_bytes: int | None, description: str, queue=None) -> None:
        from tqdm import tqdm

        self.queue = queue
        self.lines = 0
        self.start = time.perf_counter()
        self.bar = tqdm(total=total_bytes, desc=description, unit="B", unit_scale=True, file=sys.stderr)

    def __call__(self, nbytes: int, lines: int) -> None:
        self.lines += lines
        self.bar.update(nbytes)
        rate = self.lines / max(time.perf_counter() - self.start, 1e-9)
        self.bar.set_postfix_str(f"{self.lines:,} lines, {rate:,.0f} lines/s", refresh=False)

    def drain(self) -> None:
        while self.queue is not None and not self.queue.empty():
            self(*self.queue.get())

    def close(self) -> None:
        self.drain()
        self.bar.close()


_worker_queue = None


def _init_worker(queue) -> None:
    global _worker_queue
    _worker_queue = queue


def _queue_progress(nbytes: int, lines: int) -> None:
    _worker_queue.put((nbytes, lines))  # type: ignore[union-attr]


def _pool_call(task: tuple):
    fn, args = task
    return fn(*args, _queue_progress)


def _run_tasks(fn: Callable, items: list[tuple], config: PreprocessConfig, description: str) -> Iterator:
    """Yields fn(*item, progress) for every item as each finishes, computed here
    (1 worker) or in a process pool, with one progress bar over the input bytes."""
    total = _input_bytes([item[0] for item in items])
    if config.workers == 1 or len(items) == 1:
        progress = _Progress(total, description)
        try:
            for item in items:
                yield fn(*item, progress)
        finally:
            progress.close()
        return
    ctx = mp.get_context("spawn")
    queue = ctx.Manager().Queue()
    progress = _Progress(total, description, queue)
    try:
        with ctx.Pool(min(config.workers, len(items)), initializer=_init_worker, initargs=(queue,)) as pool:
            pending = [pool.apply_async(_pool_call, ((fn, item),)) for item in items]
            while pending:
                progress.drain()
                for result in [p for p in pending if p.ready()]:
                    pending.remove(result)
                    yield result.get()
                if pending:
                    pending[0].wait(0.2)
    finally:
        progress.close()


def _input_bytes(sources: Sequence[DaySource]) -> int | None:
    """Text bytes the sources hold (None for .gz: only the compressed size is known)."""
    if any(s.path.endswith(".gz") for s in sources):
        return None
    total = 0
    for s in sources:
        size = os.path.getsize(s.path)
        total += size if s.num_lines is None else size * s.num_lines // max(1, s.file_lines or 1)
    return total


def _load_or_build_vocabulary(config: PreprocessConfig, train: list[DaySource]) -> list[np.ndarray]:
    path = os.path.join(config.output_dir, VOCABULARY_FILE)
    signature = {"fingerprint": config.fingerprint(), "sources": [s.signature() for s in train]}
    if os.path.exists(path):
        with np.load(path) as saved:
            unchanged = json.loads(str(saved["signature"])) == signature
        if unchanged:
            return read_vocabulary(path, NUM_SPARSE_FEATURES)
    per_day = list(_run_tasks(count_source, [(s, config) for s in train], config, "counting categorical values"))
    vocabulary = []
    for f in range(NUM_SPARSE_FEATURES):
        ids, counts = _merge_counts([day[f] for day in per_day])
        vocabulary.append(ids[counts >= config.frequency_threshold].astype(np.uint32))
    with naming_write_errors(path), atomic_path(path, suffix=".tmp.npz") as tmp:
        np.savez(tmp, signature=json.dumps(signature), **vocabulary_arrays(vocabulary))
    return vocabulary


def _copy_training_vocabulary(config: PreprocessConfig) -> list[np.ndarray]:
    """The training run's vocabulary, copied into the output (for serving.export)."""
    source = os.path.join(str(config.vocabulary), VOCABULARY_FILE)
    try:
        vocabulary = read_vocabulary(source, NUM_SPARSE_FEATURES)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
        raise BadInput(
            f"--vocabulary {config.vocabulary}: {source} is not a preprocess_criteo vocabulary "
            f"({type(e).__name__}: {e})"
        ) from e
    path = os.path.join(config.output_dir, VOCABULARY_FILE)
    with naming_write_errors(path), atomic_path(path, suffix=".tmp.npz") as tmp:
        np.savez(tmp, signature=json.dumps({"vocabulary": config.vocabulary}), **vocabulary_arrays(vocabulary))
    return vocabulary


def preprocess(config: PreprocessConfig) -> CriteoMetadata:
    """Runs both passes; returns the metadata written to metadata.json."""
    config.validate()
    training_run = None
    if config.vocabulary is not None:
        training_run = _training_run(config.vocabulary)
        config = dataclasses.replace(
            config,
            frequency_threshold=training_run.frequency_threshold,
            num_embeddings_per_feature=training_run.modulo_num_embeddings_per_feature,
        )
    sources = discover_sources(config)
    os.makedirs(config.output_dir, exist_ok=True)
    # What an earlier run left that this one will not own: its metadata (rewritten at
    # the end), the days beyond this run's, and a vocabulary this run does not use.
    stale = [metadata_file(config.output_dir)]
    if config.frequency_threshold == 0:
        stale.append(os.path.join(config.output_dir, VOCABULARY_FILE))
    for path in stale:
        if os.path.exists(path):
            os.remove(path)
    remove_day_files_from(config.output_dir, len(sources))
    vocabulary = None
    if config.frequency_threshold > 0:
        vocabulary = (
            _copy_training_vocabulary(config)
            if config.vocabulary is not None
            else _load_or_build_vocabulary(config, sources[:-1])
        )  # training days only
    results: dict[int, DayResult] = {}
    todo = []
    for source in sources:
        done = _finished(config, source)
        if done is not None:
            results[source.day] = done
        else:
            todo.append(source)
    if todo:
        for result in _run_tasks(
            transform_source, [(s, config, vocabulary) for s in todo], config, "writing day files"
        ):
            results[result.day] = result
            source = sources[result.day]
            write_json(
                done_marker(config.output_dir, result.day),
                {"fingerprint": config.fingerprint(), "source": source.signature(), **asdict(result)},
            )
    ordered = [results[s.day] for s in sources]
    if training_run is not None:
        cardinalities = training_run.num_embeddings_per_feature
    elif vocabulary is not None:
        cardinalities = [len(v) + 1 for v in vocabulary]
        if config.num_embeddings_per_feature is not None:
            cardinalities = [min(c, s) for c, s in zip(cardinalities, config.num_embeddings_per_feature)]
    elif config.num_embeddings_per_feature is not None:
        cardinalities = list(config.num_embeddings_per_feature)
    else:
        cardinalities = [max(r.max_ids[f] for r in ordered) + 1 for f in range(NUM_SPARSE_FEATURES)]
    bad_lines: dict[str, int] = {}
    for source, result in zip(sources, ordered):
        key = source.name if config.dataset_name == "criteo_1t" else f"{source.name} (day {source.day})"
        bad_lines[key] = result.bad_lines
    metadata = CriteoMetadata(
        num_days=len(sources),
        rows_per_day=[r.rows for r in ordered],
        num_embeddings_per_feature=[int(c) for c in cardinalities],
        dataset_name=config.dataset_name,
        dense_transform=f"log(max(x, 0) + {DENSE_OFFSET:g})",
        frequency_threshold=config.frequency_threshold,
        modulo_num_embeddings_per_feature=config.num_embeddings_per_feature,
        bad_lines=bad_lines,
        split="days 0..N-2 train; day N-1: first half validation, second half test",
        vocabulary_from=config.vocabulary,
    )
    write_metadata(config.output_dir, metadata)
    return metadata


PROG = "preprocess_criteo"


@cli_main(PROG)
def main(argv: Sequence[str] | None = None) -> int:
    config = parse_flags(OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0]), PreprocessConfig, argv)
    try:
        metadata = preprocess(config)
    except OSError as e:  # a full disk, say: the message names the file
        raise BadInput(str(e)) from e
    rows, sizes, bad_lines = (
        metadata.rows_per_day or [],
        metadata.num_embeddings_per_feature or [],
        metadata.bad_lines or {},
    )
    print(
        f"wrote {sum(rows)} rows in {len(rows)} days to {config.output_dir}; "
        f"bad lines skipped: {sum(bad_lines.values())}"
    )
    print("num_embeddings_per_feature: " + ",".join(map(str, sizes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
