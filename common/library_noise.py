"""Library messages that are benign for this project, silenced by their exact text.

Every entry names the library's message exactly (a regular expression only where the
library appends a build path) and says beside it why it does not apply to our runs, so
that a message that does matter still shows: a new torch, torchrec or FBGEMM that
rewords one shows it again instead of hiding something else. The entry points call
`quiet_benign_library_messages` once at start-up (training/main.py, serving/export.py).
Messages that matter are explained in docs/training.md ("Messages from the libraries").
"""

import logging
import re
import warnings
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class BenignMessage:
    """One library message we silence.

    Args:
        text: the message, exactly; with ``then_varies`` its fixed beginning.
        why: why it is benign for this project.
        category: the warning class, for ``warnings.warn`` messages.
        logger: the logger's name, for ``logging`` messages ("" for the root logger).
        then_varies: the library appends text that varies by build (a source path).
    """

    text: str
    why: str
    category: Optional[type[Warning]] = None
    logger: Optional[str] = None
    then_varies: bool = False

    def regex(self) -> str:
        return re.escape(self.text) + ("" if self.then_varies else r"\Z")


BENIGN_MESSAGES: tuple[BenignMessage, ...] = (
    BenignMessage(
        "`broadcast_buffers` is deprecated. Use `forward_sync_buffers` instead. IMPORTANT: unlike "
        "`broadcast_buffers=False`, `forward_sync_buffers=False` still syncs buffers at init. If you rely on "
        "buffers NOT being synced at init (e.g. rank-local buffers), keep using `broadcast_buffers=False` until "
        "`init_sync_buffers` is available.",
        why="torchrec wraps the MLPs in DDP with broadcast_buffers=False; our MLPs have no buffers",
        category=FutureWarning),
    BenignMessage(
        "is_fx_tracing will return true for both fx.symbolic_trace and torch.export. Please use "
        "is_fx_tracing_symbolic_tracing() for specifically fx.symbolic_trace or torch.compiler.is_compiling() "
        "for specifically torch.export/compile.",
        why="an API rename notice printed when the pipelines trace the model; we call neither function",
        logger="torch.fx._symbolic_trace"),
    BenignMessage(
        "Sharding Type is data_parallel, caching params will be ignored",
        why="a data-parallel table has no cache to configure: every rank holds it whole (one line per table "
            "and rank otherwise)",
        logger="torchrec.distributed.utils"),
    BenignMessage(
        "Compute Kernel is dense, caching params will be ignored",
        why="the same for a dense-kernel table",
        logger="torchrec.distributed.utils"),
    BenignMessage(
        "fbgemm::dense_embedding_codegen_lookup_function: an autograd kernel was not registered to the Autograd "
        "key(s) but we are trying to backprop through it. This may lead to silently incorrect behavior.",
        why="the dense kernel of data-parallel tables: its gradients are right (tests/test_sharding_equivalence.py "
            "trains data_parallel tables to the weights of one process)",
        category=UserWarning, then_varies=True),
    BenignMessage(
        "Trying to non-strict torch.export KJT to_dict, which is extremely slow and not recommended!",
        why="serving.export traces the model once (seconds), not per request",
        logger=""),
    BenignMessage(
        "torch.distributed is disabled, unavailable or uninitialized, assuming the intent is to load in a "
        "single process.",
        why="serving.export reads a checkpoint in one process, as intended",
        category=UserWarning),
)


class _DropExactMessages(logging.Filter):
    """Drops a logger's records whose message matches one of ours."""

    def __init__(self, regexes: tuple[str, ...]) -> None:
        super().__init__()
        self._regexes = tuple(re.compile(r) for r in regexes)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(r.match(message) for r in self._regexes)


def quiet_benign_library_messages() -> None:
    """Installs the filters of `BENIGN_MESSAGES` (warnings and loggers); idempotent."""
    by_logger: dict = {}
    for entry in BENIGN_MESSAGES:
        if entry.category is not None:
            warnings.filterwarnings("ignore", message=entry.regex(), category=entry.category)
        if entry.logger is not None:
            by_logger.setdefault(entry.logger, []).append(entry.regex())
    for name, regexes in by_logger.items():
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, _DropExactMessages)]:
            logger.removeFilter(old)
        logger.addFilter(_DropExactMessages(tuple(regexes)))
