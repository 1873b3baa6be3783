"""An exclusive lock on a path for the length of a run, that a crashed run does not
leave stuck and that works on a file system several hosts share (NFS included).

The lock is a file created with O_CREAT | O_EXCL (atomic on local file systems and
on NFS v3 and later), holding who holds it: host, pid, start time. While held, a
thread touches the file every ``heartbeat_s`` seconds. Another process finds the
lock stale, and takes it over, when its holder is a process of this host that no
longer exists, or when the file has not been touched for ``stale_after_s`` seconds
(a holder on another host that crashed, or lost its mount). No flock: it is not
shared between hosts on every NFS set-up.

Example::

    with PathLock("ckpt/.lock", "--checkpoint_dir ckpt"):
        ...  # a second process gets LockHeld: "--checkpoint_dir ckpt is in use by pid 7 on host-a since ..."
"""

import contextlib
import json
import os
import socket
import stat
import threading
import time
import uuid
from typing import Any

from common.errors import BadInput

HEARTBEAT_S = 10.0
# Long enough for a heartbeat delayed by a loaded host or a slow NFS server,
# and for clocks of different hosts that differ by a few seconds.
STALE_AFTER_S = 120.0


class LockHeld(BadInput):
    """Another live process holds the lock."""


class PathLock:
    """Holds the lock file ``path`` from `acquire` (or entering) to `release` (or leaving).

    Args:
        path: the lock file (its directory must exist).
        what: names the locked thing in the refusal (a flag and its value).
        heartbeat_s: how often the holder touches the file.
        stale_after_s: how long an untouched file counts as held.
    """

    def __init__(
        self, path: str, what: str, heartbeat_s: float = HEARTBEAT_S, stale_after_s: float = STALE_AFTER_S
    ) -> None:
        self.path = path
        self.what = what
        self.heartbeat_s = heartbeat_s
        self.stale_after_s = stale_after_s
        self._holder: dict[str, Any] = {}
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def __enter__(self) -> "PathLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def acquire(self) -> None:
        """Takes the lock, or raises LockHeld naming its holder (host, pid, start time)."""
        holder = {
            "host": _host(),
            "pid": os.getpid(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "token": uuid.uuid4().hex,
        }
        for _ in range(3):  # a stale lock removed, or a holder gone between two looks
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._refuse_unless_a_file()
                self._remove_if_stale()
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(holder, f)
                f.flush()
                os.fsync(f.fileno())
            self._holder = holder
            self._stop.clear()
            self._heartbeat = threading.Thread(target=self._beat, name=f"lock heartbeat {self.path}", daemon=True)
            self._heartbeat.start()
            return
        raise LockHeld(f"{self.what}: cannot take the lock {self.path} (taken and released repeatedly meanwhile)")

    def release(self) -> None:
        """Stops the heartbeat and removes the lock file, if it is still this one's."""
        if self._heartbeat is None:
            return
        self._stop.set()
        self._heartbeat.join()
        self._heartbeat = None
        if self._read() == self._holder:  # not when another process took it over as stale
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            with contextlib.suppress(OSError):  # a missed beat: the next one, or staleness, tells
                os.utime(self.path)

    def _read(self) -> dict[str, Any] | None:
        """The holder the lock file names; None when there is no lock file. A file
        being written (or damaged) reads as an empty holder."""
        try:
            with open(self.path) as f:
                holder = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}
        return holder if isinstance(holder, dict) else {}

    def _refuse_unless_a_file(self) -> None:
        """Raises LockHeld when the lock's path is something no lock holder creates (a
        directory, a symbolic link, a FIFO): it is not judged stale and moved aside,
        since what it holds is not this class's to remove."""
        try:
            mode = os.lstat(self.path).st_mode
        except FileNotFoundError:
            return  # released meanwhile
        if stat.S_ISREG(mode):
            return
        kind = (
            "a directory" if stat.S_ISDIR(mode) else "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
        )
        raise LockHeld(
            f"{self.what}: its lock file {self.path} is {kind}, which no run creates; "
            f"remove it (after checking nothing of yours is in it) and run again"
        )

    def _remove_if_stale(self) -> None:
        """Removes the lock file when its holder is gone; raises LockHeld otherwise."""
        holder = self._read()
        try:
            age = time.time() - os.stat(self.path).st_mtime
        except FileNotFoundError:
            return  # released meanwhile
        if holder is None:
            return
        if age <= self.stale_after_s and not _dead_on_this_host(holder):
            if not holder:  # being written by its creator (a fresh file) or damaged: wait for staleness
                raise LockHeld(
                    f"{self.what} is in use: {self.path} was created {age:.0f} s ago "
                    f"(stale after {self.stale_after_s:.0f} s untouched)"
                )
            raise LockHeld(
                f"{self.what} is in use by pid {holder.get('pid')} on {holder.get('host')} "
                f"since {holder.get('started')} (lock file {self.path}; it is released when that "
                f"run ends, and counts as stale {self.stale_after_s:.0f} s after its holder stops)"
            )
        # Stale. Rename, then check that what was renamed is what was judged stale: two
        # processes taking over at once must not remove the lock the quicker one just took.
        aside = f"{self.path}.stale-{uuid.uuid4().hex}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        try:
            with open(aside) as f:
                renamed = json.load(f)
        except (OSError, ValueError):
            renamed = {}
        if renamed != holder:  # a fresh lock: put it back unless yet another exists
            with contextlib.suppress(FileExistsError):
                os.link(aside, self.path)
        os.unlink(aside)


def _host() -> str:
    """This host's name, and its PID namespace when not the first (containers sharing
    the host's name see different processes under the same pids)."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:  # no /proc (macOS)
        return socket.gethostname()
    return socket.gethostname() + ("" if namespace == _INITIAL_PID_NAMESPACE else f" ({namespace})")


_INITIAL_PID_NAMESPACE = "pid:[4026531836]"  # the kernel's fixed inode number of the initial one


def _dead_on_this_host(holder: dict[str, Any]) -> bool:
    """Whether the holder is a process of this host that no longer exists."""
    if holder.get("host") != _host() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # exists, another user's
        return False
    return False
