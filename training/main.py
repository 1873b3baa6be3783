"""The shared body of the entry points: flags -> config -> trainer, with exit codes.

Exit codes: 0 done; 2 bad flags or input (one line on stderr, on every rank, before
any collective where it can be known then, so no rank hangs; an unusable checkpoint
too); 3 the loss became NaN or infinite.
"""

import logging
import sys
import warnings
from typing import Any, Dict, Optional, Sequence

import torch.distributed as dist

from training.distributed import resolve_env
from training.flags import parse_config
from training.trainer import NonFiniteLossError, Trainer


def run_training(
    argv: Optional[Sequence[str]],
    prog: str,
    description: str,
    defaults: Optional[Dict[str, Any]] = None,
) -> int:
    """Parses ``argv`` with the given flag defaults, trains, returns the exit code."""
    _quiet_known_library_noise()
    config = parse_config(argv, prog, description, defaults)
    try:
        trainer = Trainer(config, resolve_env(config.device))
        if config.mode == "train":
            trainer.fit()
        else:
            trainer.evaluate_checkpoint()
    except ValueError as e:  # bad input, including an unusable checkpoint
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except NonFiniteLossError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 3
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


def _quiet_known_library_noise() -> None:
    """Silences two messages every rank would print on every run, which say nothing
    about the run: torchrec wraps the dense part in DDP with a deprecated argument, and
    fx warns about an API rename when the train pipeline traces the model."""
    warnings.filterwarnings("ignore", message="`broadcast_buffers` is deprecated", category=FutureWarning)
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
