"""Writing a file or a directory so that it appears complete or not at all.

The content goes to a temporary name beside the target (so the rename stays on one
file system), is flushed to disk (fsync of the file, then of the directory
after the rename) and takes the target's name only when complete. A failure leaves
the target as it was and no temporary behind.

Example::

    write_json("out/metadata.json", {"rows": 10})
    with atomic_path("run.png", suffix=".tmp.png") as tmp:  # a file another library writes
        figure.savefig(tmp)
    with atomic_dir("model", replace=False) as staging:
        write_text(os.path.join(staging, "a.txt"), "...")
"""

import contextlib
import io
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any, BinaryIO


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str, suffix: str = ".tmp") -> Iterator[str]:
    """Yields the temporary name ``path + suffix``; renames it to ``path`` when the
    block completes, removes it when the block fails. The name is fixed, so that a
    run killed midway leaves one leftover, which the next run overwrites.

    Args:
        path: the file to (re)write.
        suffix: ends the temporary name; writers that go by the extension need it
            (np.savez adds ".npz" to a name without it, matplotlib picks the format).

    Example::

        with atomic_path("counts.npz", suffix=".tmp.npz") as tmp:
            np.savez(tmp, ids=ids)
    """
    tmp = path + suffix
    try:
        yield tmp
        _fsync(tmp)
        os.replace(tmp, path)
        _fsync(os.path.dirname(os.path.abspath(path)))
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


@contextlib.contextmanager
def naming_write_errors(path: str) -> Iterator[None]:
    """An OSError inside the block (a full disk, say) becomes one naming ``path``.

    Example::

        with naming_write_errors("out/a.npz"), atomic_path("out/a.npz", ".tmp.npz") as tmp:
            np.savez(tmp, a=a)
    """
    try:
        yield
    except OSError as e:
        raise OSError(f"{path}: cannot write ({e.strerror or e})") from e


class _ErrorKeepingStream(io.RawIOBase):
    """Writes through to ``stream``, every byte or an OSError, and keeps that OSError."""

    def __init__(self, stream: BinaryIO) -> None:
        super().__init__()
        self._stream = stream
        self.error: OSError | None = None

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        try:
            done = 0
            while done < view.nbytes:  # a raw file may write part of it; the rest then fails
                done += self._stream.write(view[done:])
        except OSError as e:
            self.error = self.error or e
            raise
        return done

    def seekable(self) -> bool:
        return self._stream.seekable()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._stream.seek(offset, whence)

    def tell(self) -> int:
        return self._stream.tell()

    def flush(self) -> None:
        self._stream.flush()

    def fileno(self) -> int:
        return self._stream.fileno()


@contextlib.contextmanager
def surfacing_write_errors(stream: BinaryIO) -> Iterator[BinaryIO]:
    """Yields a file object writing to ``stream`` for torch's writers (torch.save,
    torch.export.save, torch.jit.save): when a write fails (a full disk), the block
    raises that OSError. torch's zip writer swallows it and fails later with
    "unexpected pos A vs B"; given a file name instead of a file object, it aborts the
    whole process from a destructor.

    Example::

        with naming_write_errors(path), open(path, "wb") as f, surfacing_write_errors(f) as out:
            torch.export.save(program, out)
    """
    keeper = _ErrorKeepingStream(stream)
    try:
        yield keeper  # type: ignore[misc]
    except Exception as e:
        if keeper.error is None or keeper.error is e:
            raise
        raise keeper.error from None  # the RuntimeError it became says nothing more


def write_bytes(path: str, data: bytes) -> None:
    """Writes ``data`` to ``path`` atomically; an OSError (a full disk, say) names ``path``.

    Example::

        write_bytes("model/weights.bin", blob)
    """
    with naming_write_errors(path), atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)


def write_text(path: str, text: str) -> None:
    """Writes ``text`` (UTF-8, newlines as given) to ``path`` atomically.

    Example::

        write_text("results.csv", "a,b\\n1,2\\n")
    """
    write_bytes(path, text.encode())


def write_json(path: str, payload: Any, indent: int = 2) -> None:
    """Writes ``payload`` as indented JSON with a final newline to ``path`` atomically.

    Example::

        write_json("run.json", {"state": "done"})
    """
    write_text(path, json.dumps(payload, indent=indent) + "\n")


@contextlib.contextmanager
def atomic_dir(path: str, replace: bool = True) -> Iterator[str]:
    """Yields a fresh staging directory beside ``path``; puts it in ``path``'s place
    when the block completes, removes it when the block fails (``path`` untouched).

    Args:
        path: the directory to create.
        replace: True: an existing ``path`` is replaced (never appended to). False: only
            an empty one is (a non-empty one fails with OSError at the rename); callers
            refusing an existing output say so before the work starts.

    Example::

        with atomic_dir("out") as staging:
            write_text(os.path.join(staging, "a.txt"), "a")
    """
    target = os.path.abspath(path)
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.tmp", dir=parent)
    os.chmod(staging, 0o777 & ~_umask())  # mkdtemp makes it private; the output is an ordinary directory
    try:
        yield staging
        for folder, _, names in os.walk(staging):
            for name in names:
                if not os.path.islink(os.path.join(folder, name)):
                    _fsync(os.path.join(folder, name))
            _fsync(folder)
        if os.path.isdir(target) and not os.listdir(target):
            os.rmdir(target)
        if os.path.exists(target) and replace:
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.old", dir=parent)
            os.replace(target, os.path.join(old, "previous"))
            os.replace(staging, target)
            shutil.rmtree(old)
        else:
            os.rename(staging, target)  # fails on an existing non-empty directory: never merged
        _fsync(parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def atomic_symlink(link: str, target: str) -> None:
    """Points the symlink ``link`` at ``target``, atomically: readers following ``link``
    see the old target or the new one, never no link (a new link is made beside it,
    then renamed over it with os.replace, and the directory flushed). The link holds
    ``target`` relative to the link's directory, so that the two can move together
    (a daily loop's ``STATE_DIR/current`` naming ``STATE_DIR/exports/day_3``). The
    promotion of an export to the one in service: ``serving.serve --model LINK``
    reloads it.

    Raises FileNotFoundError when ``target`` does not exist (a link to nothing is
    never made) and IsADirectoryError when ``link`` is a directory, not a link.

    Example::

        atomic_symlink("state/current", "state/exports/day_3")
    """
    if not os.path.exists(target):
        raise FileNotFoundError(f"{target}: no such file or directory to link {link} to")
    if os.path.isdir(link) and not os.path.islink(link):
        raise IsADirectoryError(f"{link} is a directory, not a link: it is not replaced")
    parent = os.path.dirname(os.path.abspath(link))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(link)}.{os.getpid()}.tmp")
    if os.path.lexists(tmp):  # what a killed run of this process id left
        os.unlink(tmp)
    os.symlink(os.path.relpath(os.path.abspath(target), parent), tmp)
    try:
        os.replace(tmp, link)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    _fsync(parent)
