"""The shared body of the entry points: flags -> config -> trainer, with exit codes.

Exit codes (training/failures.py): 0 done; 1 a rank failed during setup or
training (its message names the rank and the step); 2 bad flags or input (one line
on stderr, from rank 0 of the job; every rank exits 2 and records the line for
torchrun's summary; detected before any collective where it can be known then, so no
rank hangs; an unusable checkpoint and a model that does not fit too); 3 the loss became NaN or infinite;
4 the run diverged (no better than a constant predictor, or its loss grew 100-fold); 143
SIGTERM (the message says where the rank was).
"""

import gc
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Optional

from common.cli import run_cli
from common.errors import BadInput
from common.library_noise import quiet_benign_library_messages
from common.sigterm import raise_on_sigterm
from data.batching.value_checks import DataValueError
from recipes import Recipe
from training.config import TrainConfig
from training.failures import (
    EXIT_BAD_INPUT,
    EXIT_DIVERGED,
    EXIT_NON_FINITE_LOSS,
    report,
    report_bad_input,
    report_rank_failure,
)
from training.flags import parse_config_and_source

if TYPE_CHECKING:
    from data.sources import DataSource
    from training.distributed import DistributedEnv
    from training.trainer import Trainer


def run_training(
    argv: Sequence[str] | None,
    prog: str,
    description: str,
    entry_recipe: Recipe | None = None,
) -> int:
    """Parses ``argv`` with the entry point's recipe as defaults, trains, returns the exit code."""
    quiet_benign_library_messages()
    config, source = parse_config_and_source(argv, prog, description, entry_recipe)
    with raise_on_sigterm():
        return _train(config, prog, source=source)


def run_with_trainer(config: TrainConfig, prog: str, work: "Callable[[Trainer], object]") -> int:
    """Builds the trainer of ``config`` and runs ``work`` on it, with the entry points'
    exit codes, SIGTERM handling and teardown (how ``training.lr_finder`` runs)."""
    quiet_benign_library_messages()
    with raise_on_sigterm():
        return _train(config, prog, work)


def _by_mode(trainer: "Trainer") -> None:
    from training.inference_benchmark import run_inference_benchmark

    mode = trainer.config.mode
    if mode == "train":
        trainer.fit()
    elif mode == "inference_benchmark":
        run_inference_benchmark(trainer)
    else:
        trainer.evaluate_checkpoint()


def _train(
    config: TrainConfig,
    prog: str,
    work: "Callable[[Trainer], object]" = _by_mode,
    source: Optional["DataSource"] = None,
) -> int:
    # torch and torchrec load only now, after the flags: --help and bad flags answer in
    # a fraction of a second instead of the seconds they take to load.
    import torch.distributed as dist

    from training.distributed import agree_on_readiness, resolve_env

    try:
        env = resolve_env(config.device)
    except BadInput as e:  # this host's environment (RANK, CUDA), which may differ by rank: every rank says it
        # after telling the other ranks, which would otherwise wait for this one at their
        # first collective until its timeout (30 minutes)
        return report(prog, agree_on_readiness(str(e)) or str(e), EXIT_BAD_INPUT)
    failed = agree_on_readiness(None)  # another rank's host may not be able to take part
    if failed is not None:
        return report(prog, failed, EXIT_BAD_INPUT)
    code = run_cli(lambda: _run(config, prog, env, work, source), prog, report_bad_input)
    # Tear the process group down unless a rank failed: then a peer may be gone, and
    # gloo's teardown would block this rank and keep torchrun from restarting the job.
    # (Bad input, a non-finite loss and divergence are seen by every rank alike.)
    if code in (0, EXIT_BAD_INPUT, EXIT_NON_FINITE_LOSS, EXIT_DIVERGED) and dist.is_initialized():
        dist.destroy_process_group()
        # That does not stop gloo's threads (its backend has no shutdown): they stop when
        # the backend is freed, and the model, pipelines and trainer hold it in reference
        # cycles. Freed at interpreter shutdown instead, their teardown runs while Python
        # finalizes, where a gloo thread that needs the GIL can abort the process (SIGABRT).
        gc.collect()
    return code


def _run(
    config: TrainConfig,
    prog: str,
    env: "DistributedEnv",
    work: "Callable[[Trainer], object]",
    source: Optional["DataSource"] = None,
) -> int:
    import torch.distributed as dist

    from sharding_plans import PlanDoesNotFit
    from training.distributed import PeerNotReady, agree_on_readiness
    from training.trainer import DivergedError, NonFiniteLossError, Trainer

    try:
        trainer = Trainer(config, env, source)
    except PeerNotReady as e:  # another rank's line, which its host's log has: this host's too
        return report(prog, str(e), EXIT_BAD_INPUT)
    except BadInput as e:  # bad input, including an unusable checkpoint: run_cli reports it
        if not dist.is_initialized():  # found before the first collective: the other ranks wait there
            agree_on_readiness(str(e))
        raise
    except PlanDoesNotFit as e:  # planned on rank 0, raised on every rank
        raise BadInput(
            f"the model does not fit: {e} ({env.world_size} {env.device.type} "
            "rank(s)); python -m sharding_plans plan tells how many it needs"
        ) from e
    except Exception as e:  # a ValueError inside torch included: a failure, with its traceback
        return report_rank_failure(prog, env.rank, env.world_size, "setup", e)
    try:
        work(trainer)
    except NonFiniteLossError as e:
        return report(prog, str(e), EXIT_NON_FINITE_LOSS)
    except DivergedError as e:
        return report(prog, str(e), EXIT_DIVERGED)
    except DataValueError as e:
        if e.seen_by_every_rank:  # one line for the job, exit 2 on every rank
            # "found at": the pipeline reads batches ahead of the step it trains
            return report_bad_input(prog, f"bad data, found at {trainer.position()}: {e}")
        return report_rank_failure(prog, env.rank, env.world_size, trainer.position(), e)
    except Exception as e:
        return report_rank_failure(prog, env.rank, env.world_size, trainer.position(), e)
    finally:
        trainer.release_checkpoint_dir()
        trainer.log.close()  # whatever the work and its end (idempotent: fit closes it too)
    return 0
