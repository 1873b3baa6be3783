"""Writing a whole output directory so that it appears complete or not at all."""

import os
import shutil
import tempfile
from typing import Callable, TypeVar

T = TypeVar("T")


def build_output_dir(output_dir: str, fill: Callable[[str], T]) -> T:
    """Runs ``fill(staging)`` on a fresh directory next to output_dir, then puts it in
    output_dir's place: an existing output is replaced (never appended to), and a
    failure leaves it untouched.

    Args:
        output_dir: the directory to (re)create.
        fill: writes the contents into the staging directory it is given.

    Example::

        build_output_dir("out", lambda d: open(os.path.join(d, "a.bin"), "wb").close())
    """
    target = os.path.abspath(output_dir)
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.tmp", dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)  # mkdtemp makes it private; the output is an ordinary directory
    try:
        result = fill(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if os.path.exists(target):
        old = f"{target}.old{os.getpid()}"
        os.replace(target, old)
        os.replace(staging, target)
        shutil.rmtree(old)
    else:
        os.replace(staging, target)
    return result
