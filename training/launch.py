"""torchrun, ending with the ranks' lines: ``python -m training.launch`` takes torchrun's
arguments and runs torchrun.

    python -m training.launch --standalone --nproc_per_node 2 dlrm_main.py --batch_size 512 ...

What differs from ``torchrun``: when the agent itself is stopped (SIGTERM from a
scheduler, Ctrl-C), torchrun stops the ranks, which each say where they were
(``dlrm_main.py: error: rank 0 of 2 stopped at step 37 ...: received SIGTERM``), and
then raises torch's ``SignalException``, whose traceback would be the last thing
printed; here the launcher exits 128 + the signal's number (143 for SIGTERM, 130 for
SIGINT) after the ranks' lines, without it. A failed rank keeps torchrun's failure
summary (exit 1), printed without the launcher's traceback above it. Bad launcher
flags, and a training script that does not exist, are one line and exit 2 before any
process starts; flag prefixes are refused (``--nproc`` for ``--nproc_per_node``), as
in every CLI of the project.
"""

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from common.cli import print_bad_input, run_cli
from common.errors import BadInput
from common.version import VERSION

PROG = "python -m training.launch"


def _parser() -> argparse.ArgumentParser:
    """torchrun's parser, reporting bad flags in one line and refusing prefixes."""
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    parser.prog = PROG
    parser.allow_abbrev = False

    def error(message: str) -> NoReturn:
        raise SystemExit(print_bad_input(PROG, message))

    parser.error = error  # type: ignore[method-assign]
    return parser


def _launch(argv: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
    from torch.distributed.run import run

    args = _parser().parse_args(argv)
    if not (args.module or args.no_python) and not os.path.isfile(args.training_script):
        raise BadInput(f"training script {args.training_script}: no such file")
    try:
        record(run)(args)  # as torchrun's own main runs it (its error file handling)
    except SignalException as e:  # the ranks were stopped and said so: nothing to add
        return 128 + int(e.sigval)
    except ChildFailedError as e:  # its message is torchrun's failure summary
        sys.stderr.write(f"{e}\n")
        sys.stderr.flush()
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Runs torchrun with ``argv`` (None: sys.argv[1:]); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--version"]:  # torchrun has no --version; every CLI of the project has
        print(f"{PROG} {VERSION}")
        return 0
    return run_cli(lambda: _launch(argv), PROG)


if __name__ == "__main__":
    sys.exit(main())
