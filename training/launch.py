"""torchrun, ending with the ranks' lines: ``python -m training.launch`` takes torchrun's
arguments unchanged and runs torchrun's own main.

    python -m training.launch --standalone --nproc_per_node 2 dlrm_main.py --batch_size 512 ...

What differs from ``torchrun``: when the agent itself is stopped (SIGTERM from a
scheduler, Ctrl-C), torchrun stops the ranks, which each say where they were
(``dlrm_main.py: error: rank 0 of 2 stopped at step 37 ...: received SIGTERM``), and
then raises torch's ``SignalException``, whose traceback would be the last thing
printed; here the launcher exits 128 + the signal's number (143 for SIGTERM, 130 for
SIGINT) after the ranks' lines, without it. A failed rank keeps torchrun's failure
summary (exit 1), printed without the launcher's traceback above it.
"""

import sys
from typing import Optional
from collections.abc import Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs torchrun with ``argv`` (None: sys.argv[1:]); returns the exit code."""
    # torch loads only now: --help is torchrun's, which needs it anyway.
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:
        torchrun(list(sys.argv[1:] if argv is None else argv))
    except SignalException as e:  # the ranks were stopped and said so: nothing to add
        return 128 + int(e.sigval)
    except ChildFailedError as e:  # its message is torchrun's failure summary
        sys.stderr.write(f"{e}\n")
        sys.stderr.flush()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
