"""The files of a Parquet table (``--parquet_path``): discovery, Hive partitions, footers.

``--parquet_path`` is a file, a directory (read recursively) or a glob, local, a
``file://`` URL or any URL pyarrow's filesystems open (``s3://``, ``gs://``,
``hdfs://``); other schemes go through fsspec. Files are taken in sorted path order;
in a directory, names starting with ``_`` or ``.`` (``_SUCCESS``, ``.crc`` files) are
skipped, as Spark and pyarrow do. A glob has path semantics (`glob_regex`): ``*``, ``?``
and ``[...]`` match within one path segment, ``**`` any number of segments; it matches
files, and directories, which are read as a directory is; no wildcard matches a name
starting with ``_`` or ``.``. Directories named ``key=value`` (Hive partitions,
such as ``date=2026-11-01/``) give every row of the files below them a column
``key``: integers when every value of the key is one, dates when every value is an
ISO date (YYYY-MM-DD), else strings.

Only the footers are read here (schema, rows per row group, statistics): the
table's rows are read by data/parquet/loader.py, one row group at a time.
"""

import datetime
import posixpath
import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from common.errors import BadInput
from common.url_paths import check_url_path, redacted

_GLOB_CHARACTERS = re.compile(r"[*?\[]")
_INTEGER = re.compile(r"-?[0-9]+\Z")
_ISO_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}\Z")


@dataclass(frozen=True)
class FileFooter:
    """What the footer of one file says, plus its partition values.

    Args:
        path: the file, as its filesystem names it (messages name it so).
        partitions: the Hive partition values of its directories (key -> value).
        row_group_rows: rows of each row group.
    """

    path: str
    partitions: dict[str, Any]
    row_group_rows: tuple[int, ...]

    @property
    def num_rows(self) -> int:
        return sum(self.row_group_rows)

    def first_row(self, row_group: int) -> int:
        """The row number in the file of the row group's first row."""
        return sum(self.row_group_rows[:row_group])


def _local_or_uri(path: str, flag: str) -> tuple[pafs.FileSystem, str, str]:
    """(filesystem, path inside it, how messages name the root: without secrets).

    Raises:
        BadInput: a URL with credentials (common/url_paths.py), or one no filesystem opens.
    """
    if "://" not in path:
        return pafs.LocalFileSystem(), posixpath.abspath(path) if not path.startswith("/") else path, path
    check_url_path(path, flag)  # every route to a table (training, export, predict) comes here
    shown = redacted(path)
    if path.startswith("file://"):
        return pafs.LocalFileSystem(), urllib.parse.unquote(path[len("file://") :]), shown
    try:
        filesystem, inner = pafs.FileSystem.from_uri(path)
        return filesystem, inner, shown
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
        pass  # a scheme pyarrow has no filesystem for
    except OSError as e:  # pyarrow's filesystem, but it cannot reach the store
        raise BadInput(f"{flag} {shown}: cannot open it ({e})") from e
    try:
        import fsspec

        fs, inner = fsspec.core.url_to_fs(path)
    except (ImportError, ValueError) as e:
        raise BadInput(f"{flag} {shown}: no filesystem opens this URL ({e})") from e
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), inner, shown


def _hidden(relative: str) -> bool:
    return any(part.startswith(("_", ".")) for part in relative.split("/"))


# A wildcard never matches a hidden name (_SUCCESS, .crc), as a directory read skips them.
_NOT_HIDDEN = "(?![._])"


def _segment_regex(segment: str) -> str:
    """One path segment of a glob as a regex: ``*`` and ``?`` within the segment, ``[...]``
    a character class (``[!...]`` negated), anything else literal."""
    out, i, n = [], 0, len(segment)
    while i < n:
        c = segment[i]
        if c in "*?":
            out.append((_NOT_HIDDEN if i == 0 else "") + ("[^/]*" if c == "*" else "[^/]"))
        elif c == "[":
            j = i + 1
            j += j < n and segment[j] == "!"
            j += j < n and segment[j] == "]"  # a ] first is a member: []] or [!]]
            j = segment.find("]", j)
            if j < 0:  # no class: a literal [
                out.append(re.escape(c))
            else:
                body = segment[i + 1 : j]
                negated = body.startswith("!")
                body = re.sub(r"([\\\[&~|])", r"\\\1", body[1:] if negated else body)  # literal in a class
                out.append(("[^/" if negated else "[\\" if body.startswith("^") else "[") + body + "]")
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def glob_regex(pattern: str) -> "re.Pattern[str]":
    """A path glob as a regex over whole paths: ``*``, ``?`` and ``[...]`` within one
    segment, a ``**`` segment any number of segments (none included).

    Example::

        glob_regex("lake/*/part-*.parquet").fullmatch("lake/date=2026-11-01/part-0.parquet")  # a match
        glob_regex("lake/*.parquet").fullmatch("lake/date=2026-11-01/part-0.parquet")          # None
    """
    regex = ""
    segments = pattern.rstrip("/").split("/")
    for k, segment in enumerate(segments):
        last = k == len(segments) - 1
        if segment == "**":
            regex += f"(?:{_NOT_HIDDEN}[^/]+(?:/{_NOT_HIDDEN}[^/]+)*)?" if last else f"(?:{_NOT_HIDDEN}[^/]+/)*"
        else:
            regex += _segment_regex(segment) + ("" if last else "/")
    return re.compile(regex)


def _under_a_match(file: str, pattern: "re.Pattern[str]") -> bool:
    """Whether the glob matches ``file`` or a directory above it that holds it under no
    hidden name (a matched directory is read as ``--parquet_path DIRECTORY`` is)."""
    if pattern.fullmatch(file):
        return True
    parts = file.split("/")
    for k in range(len(parts) - 1, 0, -1):
        if parts[k].startswith(("_", ".")):
            return False  # hidden below any directory above this one
        if pattern.fullmatch("/".join(parts[:k])):
            return True
    return False


def list_files(path: str, flag: str = "--parquet_path") -> tuple[pafs.FileSystem, str, list[str]]:
    """(filesystem, root directory, the table's files in sorted path order); ``flag``
    names ``path`` in errors.

    Raises:
        BadInput: nothing at ``path``, or no file there.
    """
    filesystem, inner, shown = _local_or_uri(path, flag)
    try:
        if _GLOB_CHARACTERS.search(inner):
            base = inner[: _GLOB_CHARACTERS.search(inner).start()]  # type: ignore[union-attr]
            base = (base.rsplit("/", 1)[0] or "/") if "/" in base else "."
            infos = filesystem.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
            pattern = glob_regex(inner)
            files = [i.path for i in infos if i.type == pafs.FileType.File and _under_a_match(i.path, pattern)]
            root = base
        else:
            info = filesystem.get_file_info(inner)
            if info.type == pafs.FileType.NotFound:
                raise BadInput(f"{flag} {shown}: no such file or directory")
            if info.type == pafs.FileType.File:
                return filesystem, posixpath.dirname(inner), [inner]
            root = inner.rstrip("/")
            infos = filesystem.get_file_info(pafs.FileSelector(root, recursive=True))
            files = [
                i.path for i in infos if i.type == pafs.FileType.File and not _hidden(i.path[len(root) :].lstrip("/"))
            ]
    except OSError as e:
        raise BadInput(f"{flag} {shown}: cannot list it ({e})") from e
    if not files:
        raise BadInput(f"{flag} {shown}: no Parquet file there")
    return filesystem, root, sorted(files)


def _partition_parts(root: str, file: str) -> dict[str, str]:
    relative = file[len(root) :].lstrip("/") if file.startswith(root) else posixpath.basename(file)
    parts = {}
    for directory in relative.split("/")[:-1]:
        if "=" in directory:
            key, value = directory.split("=", 1)
            parts[urllib.parse.unquote(key)] = urllib.parse.unquote(value)
    return parts


def column_names(path: str, listing: tuple[pafs.FileSystem, str, list[str]] | None = None) -> list[str]:
    """The table's column names: the first file's columns, then its partition keys
    (only that footer is read); ``listing``: what `list_files` gave (None: lists it)."""
    filesystem, root, files = listing or list_files(path)
    names = read_metadata(filesystem, files[0]).schema.to_arrow_schema().names
    return names + [key for key in _partition_parts(root, files[0]) if key not in names]


def partition_type(values: Sequence[str]) -> pa.DataType:
    """int64 when every value is an integer, date32 when every one is an ISO date, else string."""
    if all(_INTEGER.match(v) for v in values):
        return pa.int64()
    if all(_ISO_DATE.match(v) for v in values):
        return pa.date32()
    return pa.string()


def _typed(value: str, kind: pa.DataType) -> Any:
    if kind == pa.int64():
        return int(value)
    if kind == pa.date32():
        return datetime.date.fromisoformat(value)
    return value


def read_footers(
    filesystem: pafs.FileSystem, root: str, files: Sequence[str]
) -> tuple[list[FileFooter], list[pq.FileMetaData], pa.Schema]:
    """Every file's footer, its partitions, and the table's schema (the first file's
    schema plus the partition columns).

    Raises:
        BadInput: a file that is not Parquet (or is truncated), files that disagree on
            their partition keys, a partition key that is also a column.
    """
    raw = [_partition_parts(root, f) for f in files]
    keys = list(raw[0])
    for file, parts in zip(files, raw):
        if list(parts) != keys:
            raise BadInput(
                f"{file}: partition directories {'/'.join(parts) or '(none)'} differ from "
                f"{files[0]}'s ({'/'.join(keys) or 'none'})"
            )
    kinds = {key: partition_type([parts[key] for parts in raw]) for key in keys}
    footers, metadata = [], []
    for file, parts in zip(files, raw):
        meta = read_metadata(filesystem, file)
        footers.append(
            FileFooter(
                file,
                {k: _typed(v, kinds[k]) for k, v in parts.items()},
                tuple(meta.row_group(g).num_rows for g in range(meta.num_row_groups)),
            )
        )
        metadata.append(meta)
    schema = metadata[0].schema.to_arrow_schema()
    for key, kind in kinds.items():
        if key in schema.names:
            raise BadInput(f"{files[0]}: column {key} is also a partition directory ({key}=...)")
        schema = schema.append(pa.field(key, kind, nullable=False))
    return footers, metadata, schema


def read_metadata(filesystem: pafs.FileSystem, file: str) -> pq.FileMetaData:
    """The footer of one file.

    Raises:
        BadInput: the file cannot be read, is not Parquet or is truncated.
    """
    try:
        with filesystem.open_input_file(file) as handle:
            return pq.ParquetFile(handle).metadata
    except (pa.ArrowInvalid, OSError) as e:
        raise BadInput(f"{file}: not a Parquet file, or truncated ({e})") from e


def file_schema(footer: FileFooter, meta: pq.FileMetaData, schema: pa.Schema) -> pa.Schema:
    """One file's own schema plus the table's partition columns."""
    own = meta.schema.to_arrow_schema()
    for key in footer.partitions:
        own = own.append(schema.field(key))
    return own


def check_same_types(
    footers: Sequence[FileFooter], metadata: Sequence[pq.FileMetaData], schema: pa.Schema, columns: Sequence[str]
) -> None:
    """Refuses a file where a column read has another type than in the first file.

    Raises:
        BadInput: ``"<file>: column C is T, but <first file> has U"``.
    """
    for footer, meta in zip(footers[1:], metadata[1:]):
        own = file_schema(footer, meta, schema)
        for column in columns:
            index = own.get_field_index(column)
            if index < 0:
                continue  # the column check names the missing column
            if own.field(index).type != schema.field(column).type:
                raise BadInput(
                    f"{footer.path}: column {column} is {own.field(index).type}, but "
                    f"{footers[0].path} has {schema.field(column).type} (a column keeps one type)"
                )


def partition_column(value: Any, kind: pa.DataType, rows: int) -> pa.Array:
    """A partition's value repeated for ``rows`` rows."""
    return pa.repeat(pa.scalar(value, type=kind), rows)


class RowCountError(BadInput):
    """A row group whose pages hold another number of rows than its footer says: the
    splits and batches, counted from the footers, would be wrong."""


def read_row_group(
    filesystem: pafs.FileSystem,
    footer: FileFooter,
    schema: pa.Schema,
    row_group: int,
    names: Sequence[str],
    use_threads: bool = True,
    dictionary: Sequence[str] = (),
) -> pa.Table:
    """The columns ``names`` of one row group of a file (partition columns made from
    its path), of the table ``schema``'s types; ``use_threads``: decoded by pyarrow's
    pool of threads, else in the calling thread. The string or binary columns named in
    ``dictionary`` come dictionary-encoded (pyarrow's ``read_dictionary``: the values of
    Parquet's dictionary pages as indices into the row group's dictionary, never
    materialised; those of plain-encoded pages added to it), their dictionary of the
    schema's type.

    Raises:
        BadInput: the row group cannot be read.
        RowCountError: its pages hold another number of rows than the footer says
            (pyarrow reads what the pages hold and believes the footer elsewhere).
    """
    own = [n for n in names if n not in footer.partitions]
    encoded = [n for n in dictionary if n in own]
    try:
        with filesystem.open_input_file(footer.path) as handle:
            parquet = pq.ParquetFile(handle, read_dictionary=encoded or None)
            table = parquet.read_row_group(row_group, columns=own, use_threads=use_threads)
    except (pa.ArrowInvalid, OSError) as e:
        raise BadInput(f"{footer.path}: row group {row_group} cannot be read ({e})") from e
    if own and table.num_rows != footer.row_group_rows[row_group]:  # no column read: no rows counted
        raise RowCountError(
            f"{footer.path}: row group {row_group} holds {table.num_rows} rows, but the file's footer "
            f"says {footer.row_group_rows[row_group]} (a corrupt or rewritten footer)"
        )
    for name in names:
        if name in footer.partitions:
            table = table.append_column(
                schema.field(name), partition_column(footer.partitions[name], schema.field(name).type, table.num_rows)
            )
    fields = [schema.field(n) for n in names]
    for i, field in enumerate(fields):
        read = table.schema.field(field.name).type
        if field.name in encoded and pa.types.is_dictionary(read) and not pa.types.is_dictionary(field.type):
            fields[i] = field.with_type(pa.dictionary(read.index_type, field.type))
    return table.select(list(names)).cast(pa.schema(fields))
