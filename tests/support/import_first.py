"""Imports each project module named on the command line first, as a fresh interpreter
would, and prints one line per module that fails: ``MODULE<TAB>ERROR``.

Run as ``python -m tests.support.import_first MODULE...`` (tests/test_architecture.py).
A fresh interpreter per module would cost torch's import (seconds) each time; instead
this process imports only the third-party libraries given with ``--preload`` (which
never import the project), then forks once per module: each child starts with no
project module loaded, imports its one module, and reports. What an import circle or a
missing import among the project's modules does to a first import, the child sees.
"""

import importlib
import os
import sys
import traceback


def import_in_child(module: str) -> str:
    """The error of importing ``module`` first in a forked child ("" when it imports)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe and leave without running atexit hooks
        os.close(read_end)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)  # what an import prints is not a report line
        message = ""
        try:
            importlib.import_module(module)
        except BaseException as e:
            message = "".join(traceback.format_exception_only(e)).strip().replace("\n", " | ")
            message = message or type(e).__name__
        with os.fdopen(write_end, "w") as pipe:
            pipe.write(message)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        message = pipe.read()
    _, status = os.waitpid(pid, 0)
    if not message and os.waitstatus_to_exitcode(status) != 0:
        message = f"the child exited with {os.waitstatus_to_exitcode(status)}"
    return message


def main(argv: list[str]) -> int:
    preload = argv[argv.index("--preload") + 1].split(",") if "--preload" in argv else []
    modules = [a for i, a in enumerate(argv) if a != "--preload" and (i == 0 or argv[i - 1] != "--preload")]
    project = {m.split(".")[0] for m in modules}
    for name in preload:
        try:
            importlib.import_module(name)
        except Exception:
            pass
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in project)
    if loaded:  # a preloaded library imported the project: the children would not start clean
        print(f"--preload imported project modules: {', '.join(loaded)}", file=sys.stderr)
        return 2
    failed = 0
    for module in modules:
        message = import_in_child(module)
        if message:
            failed += 1
            print(f"{module}\t{message}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
