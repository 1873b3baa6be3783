"""The folders of a registry package kept outside this repository: a project's own
data sources or model interactions, found under the other entries of the Python path.

A registry (data/sources/, models/interactions/) imports every module of its folder;
adding `plugin_folders` to its ``__path__`` makes a folder of the same relative path
under another ``sys.path`` entry (PYTHONPATH) part of it, so a plugin kept in a
project of one's own is one file there too. The current directory's entry (``""``,
which ``python -c`` and ``python -m`` put first) is left out: running a command from
some directory never imports code found there.
"""

import os
import sys


def plugin_folders(package_path: list[str], *relative: str) -> list[str]:
    """The folders ``relative`` (``"data", "sources"``) under the ``sys.path`` entries,
    other than the package's own (``package_path``, its ``__path__``), each once and in
    the path's order; the package's own modules win a name both have."""
    seen = {os.path.realpath(folder) for folder in package_path}
    found = []
    for entry in sys.path:
        if not entry:
            continue
        folder = os.path.join(entry, *relative)
        if os.path.isdir(folder) and os.path.realpath(folder) not in seen:
            seen.add(os.path.realpath(folder))
            found.append(folder)
    return found
