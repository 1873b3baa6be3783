"""Library messages that are benign for this project, silenced by their exact text.

Every entry names the library's message exactly (a regular expression only where the
library appends a build path) and says beside it why it does not apply to our runs, so
that a message that does matter still shows: a new torch, torchrec or FBGEMM that
rewords one shows it again instead of hiding something else. The entry points call
`quiet_benign_library_messages` once at start-up (training/main.py, serving/export.py);
tests/conftest.py installs them around every test too, so that a test sees what a user sees.
Notices that hold only around one call (TorchScript's, the deprecated eager quantization's)
are quieted around that call alone (`quieted`), wherever it runs, tests included.
Messages that matter are explained in docs/training.md ("Messages from the libraries").
"""

import contextlib
import logging
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class BenignMessage:
    """One library message we silence.

    Args:
        text: the message, exactly; with ``then_varies`` its fixed beginning.
        why: why it is benign for this project.
        category: the warning class, for ``warnings.warn`` messages.
        logger: the logger's name, for ``logging`` messages ("" for the root logger).
        then_varies: the library appends text that varies by build (a source path) or
            a long migration guide after its first sentence.
    """

    text: str
    why: str
    category: type[Warning] | None = None
    logger: str | None = None
    then_varies: bool = False

    def regex(self) -> str:
        return re.escape(self.text) + ("" if self.then_varies else r"\Z")


# Inductor (training's --compile; serving.export --format aoti and loading its packages),
# torch 2.13: importing torch._inductor defines torch.utils.mkldnn's TorchScript modules,
# which says TorchScript is deprecated; compiling deep-copies pytree specs, whose LeafSpec
# check is deprecated inside torch. Neither is a use of ours. Part of `BENIGN_MESSAGES`;
# serving also quiets them around its own compile and load, for callers that install no
# filters (the predictor and server as a library).
INDUCTOR_NOTICES: tuple[BenignMessage, ...] = tuple(
    BenignMessage(text, why="torch._inductor's own imports and copies (torch 2.13)", category=category)
    for text in (
        "`torch.jit.script_method` is deprecated. Please switch to `torch.compile` or `torch.export`.",
        "`isinstance(treespec, LeafSpec)` is deprecated, use `isinstance(treespec, TreeSpec) and "
        "treespec.is_leaf()` instead.",
    )
    for category in (DeprecationWarning, FutureWarning)
)


BENIGN_MESSAGES: tuple[BenignMessage, ...] = (
    BenignMessage(
        "`broadcast_buffers` is deprecated. Use `forward_sync_buffers` instead. IMPORTANT: unlike "
        "`broadcast_buffers=False`, `forward_sync_buffers=False` still syncs buffers at init. If you rely on "
        "buffers NOT being synced at init (e.g. rank-local buffers), keep using `broadcast_buffers=False` until "
        "`init_sync_buffers` is available.",
        why="torchrec wraps the MLPs in DDP with broadcast_buffers=False; our MLPs have no buffers",
        category=FutureWarning,
    ),
    BenignMessage(
        "is_fx_tracing will return true for both fx.symbolic_trace and torch.export. Please use "
        "is_fx_tracing_symbolic_tracing() for specifically fx.symbolic_trace or torch.compiler.is_compiling() "
        "for specifically torch.export/compile.",
        why="an API rename notice printed when the pipelines trace the model; we call neither function",
        logger="torch.fx._symbolic_trace",
    ),
    BenignMessage(
        "Sharding Type is data_parallel, caching params will be ignored",
        why="a data-parallel table has no cache to configure: every rank holds it whole (one line per table "
        "and rank otherwise)",
        logger="torchrec.distributed.utils",
    ),
    BenignMessage(
        "Compute Kernel is dense, caching params will be ignored",
        why="the same for a dense-kernel table",
        logger="torchrec.distributed.utils",
    ),
    BenignMessage(
        "fbgemm::dense_embedding_codegen_lookup_function: an autograd kernel was not registered to the Autograd "
        "key(s) but we are trying to backprop through it. This may lead to silently incorrect behavior.",
        why="the dense kernel of data-parallel tables: its gradients are right (tests/training/test_sharding_equivalence.py "
        "trains data_parallel tables to the weights of one process)",
        category=UserWarning,
        then_varies=True,
    ),
    BenignMessage(
        "Trying to non-strict torch.export KJT to_dict, which is extremely slow and not recommended!",
        why="serving.export traces the model once (seconds), not per request",
        logger="",
    ),
    BenignMessage(
        "Please use DTensor instead and we are deprecating ShardedTensor.",
        why="torchrec 1.8 holds a sharded table's state as a ShardedTensor (torch warns on every torch "
        "function applied to one); the checkpoint format reads and writes it as DCP",
        category=FutureWarning,
    ),
    BenignMessage(
        "<class 'torch.autograd.function.Function'> should not be instantiated. Methods on autograd functions "
        "are all static, so you should invoke them on the class itself. Instantiating an autograd function "
        "will raise an error in a future version of PyTorch.",
        why="torch.compile's tracer (torch 2.13) instantiates the dot interaction's autograd.Function as it "
        "traces --compile; our code calls its .apply",
        category=DeprecationWarning,
    ),
    BenignMessage(
        "torch.distributed is disabled, unavailable or uninitialized, assuming the intent is to load in a "
        "single process.",
        why="serving.export reads a checkpoint in one process, as intended",
        category=UserWarning,
    ),
    *INDUCTOR_NOTICES,
)


# TorchScript is deprecated upstream, and nothing of ours uses it any more (serving's
# variants are torch.export programs); importing torch.distributed.optim still scripts
# its functional optimizers (models/embedding_optimizer.py), which quiets these around
# that import. torch 2.13 says them as DeprecationWarning, torch 2.14 as FutureWarning.
TORCHSCRIPT_NOTICES: tuple[BenignMessage, ...] = tuple(
    BenignMessage(text, why="torch.distributed.optim's import scripts its functional optimizers", category=category)
    for text in (
        "`torch.jit.script` is deprecated. Please switch to `torch.compile` or `torch.export`.",
        "`torch.jit.interface` is deprecated. Please use `torch.compile` instead.",
    )
    for category in (DeprecationWarning, FutureWarning)
)

# torchrec's quantize_inference_model (the int8/fp16 variants) calls torch.ao's eager
# quantize_dynamic, which says it moves to torchao; torchrec 1.8.0 has no other path.
EAGER_QUANTIZATION_NOTICES: tuple[BenignMessage, ...] = (
    BenignMessage(
        "torch.ao.quantization is deprecated and will be removed in 2.10. ",
        why="torchrec's quantization of the tables calls it; no torchao path in torchrec 1.8.0",
        category=DeprecationWarning,
        then_varies=True,
    ),
    BenignMessage(
        "guard_size_oblivious will be removed. Consider using explicit unbacked handling     "
        "potentially utilizing guard_or_false, guard_or_true, or statically_known_true",
        why="torchrec 1.6.1's quantized tables (the torch2.11 stack) call it while torch.export "
        "traces them; torch 2.11 deprecates it",
        category=FutureWarning,
    ),
    BenignMessage(
        "_check_is_size will be removed in a future PyTorch release along with guard_size_oblivious.     "
        "Use _check(i >= 0) instead.",
        why="the same: torchrec 1.6.1's quantized tables, traced under torch 2.11",
        category=FutureWarning,
    ),
)


@contextlib.contextmanager
def quieted(messages: tuple[BenignMessage, ...]) -> Iterator[None]:
    """Inside the block, the warnings of ``messages`` are not shown (outside, as before).

    Example::

        with quieted(TORCHSCRIPT_NOTICES):
            model = torch.jit.load(buffer)
    """
    with warnings.catch_warnings():
        for entry in messages:
            warnings.filterwarnings("ignore", message=entry.regex(), category=entry.category or Warning)
        yield


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
    by_logger: dict[str, list[str]] = {}
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
