"""``python -m training.lr_finder``: a learning-rate range test.

Trains the model the entry point's flags describe (same flags, same set-up: one
process or under torchrun) for ``--lr_steps`` steps on the training data while the
learning rate grows exponentially from ``--lr_min`` to ``--lr_max``, records the loss
at each rate (averaged over ranks) and the smoothed loss, and suggests a rate. The
smoothed loss is a centred moving average over about a twentieth of the steps: one
over past steps only lags behind the rising rate (an exponential average over ~20
steps put the minimum a decade too high in a 100-step test). The test stops early
once an exponential moving average of the loss (what is known while it runs) passes
``DIVERGED`` times its minimum, or the loss is no longer finite: past that point it
only grows.

The suggestion is the rate where the smoothed loss falls fastest (against log(lr),
before its minimum), but not below a tenth of the rate at the minimum. A tenth of the
minimum, the other usual rule and the suggestion before, underfits: on the default data
it said 0.0107, which after 150 steps tested at AUROC 0.7385 against 0.8004 at the
steepest descent's 0.0756 (docs/training.md), and on another log 0.00266, which tested
0.005 AUROC below the recipe's 0.05. The steepest descent is where a step does the most, and
it lies below the minimum, where a higher rate stops helping, so it keeps a margin for a
whole run. Its slope is a derivative of a noisy curve and can land low, so a tenth of
the minimum bounds it from below.

Writes ``--lr_range_output`` ``.json`` (`RangeTestResult`) and ``.png`` and prints the
suggestion (rank 0). The model's weights are thrown away; no checkpoint is written.

    python -m training.lr_finder --in_memory_binary_criteo_path DIR --lr_min 1e-4 --lr_max 10
    torchrun --nproc_per_node 2 -m training.lr_finder --entry_point dcnv2_main.py ...
"""

import argparse
import dataclasses
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from common.atomic import write_bytes
from common.cli import positive_int
from common.json_fields import OBJECT, JsonObject, Kind, integer, one_of, versioned_json
from common.png_figure import png_figure
from training.config import TrainConfig
from training.failures import report_bad_input
from training.flags import ENTRY_POINT_RECIPES, FlagError, build_parser, config_from_args
from training.lr_schedule import set_lr
from training.main import run_with_trainer
from training.trainer import NonFiniteLossError, Trainer

PROG = "python -m training.lr_finder"
RESULT_VERSION = 1
RULE = "the steepest descent of the smoothed loss, at least a tenth of the lr at its minimum"
# Weight of the past in the running average that detects divergence (about the last
# 10 steps count).
SMOOTHING = 0.9
# The centred moving average's window: this fraction of the steps on each side (at least 2).
WINDOW_FRACTION = 1 / 40
# The test stops once the smoothed loss exceeds this multiple of its minimum.
DIVERGED = 4.0
# Steps before the divergence check starts: the first smoothed values rest on few steps.
WARMUP_STEPS = 10
FIGURE_INCHES = (7.0, 4.5)
FIGURE_DPI = 100
_WHAT = "a learning-rate range test result"
_NUMBER = Kind(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number")
_NUMBERS = Kind(lambda v: isinstance(v, list) and all(_NUMBER.accepts(x) or x is None for x in v), "a list of numbers")


@dataclass
class RangeTestResult:
    """What ``--lr_range_output``.json holds.

    Args:
        lr_min, lr_max, lr_steps: the range asked for.
        lrs: the rate of each step run (``lr_min * (lr_max / lr_min) ** (step / (lr_steps - 1))``).
        losses: the training loss of each step, averaged over ranks (None: not finite).
        smoothed_losses: their centred moving average (``smooth``; None where the loss is).
        stopped_early: the smoothed loss diverged before ``lr_steps`` steps.
        min_loss_lr: the rate at the smoothed loss's minimum.
        steepest_descent_lr: the rate where the smoothed loss falls fastest against
            log(lr), before its minimum.
        suggested_lr: ``max(steepest_descent_lr, min_loss_lr / 10)`` (see the module).
        rule: how ``suggested_lr`` was chosen, in words.
        entry_point: ``dlrm_main.py`` or ``dcnv2_main.py`` (whose defaults applied).
        world_size: ranks the test ran on.
        config: the training configuration (``TrainConfig`` as a dict).
    """

    lr_min: float
    lr_max: float
    lr_steps: int
    lrs: list[float]
    losses: list[float | None]
    smoothed_losses: list[float | None]
    stopped_early: bool
    min_loss_lr: float
    steepest_descent_lr: float
    suggested_lr: float
    rule: str
    entry_point: str
    world_size: int
    config: dict[str, Any] = field(default_factory=dict)
    version: int = RESULT_VERSION

    def to_json(self) -> bytes:
        return versioned_json(self, kind="lr_range_test")

    @classmethod
    def from_json(cls, data: bytes, path: str) -> "RangeTestResult":
        """Reads a file this module wrote; raises FileFieldError naming the field."""
        document, _ = JsonObject.versioned(data, path, _WHAT, RESULT_VERSION)
        document.get("kind", one_of("lr_range_test"))
        return cls(
            lr_min=document.get("lr_min", _NUMBER),
            lr_max=document.get("lr_max", _NUMBER),
            lr_steps=document.get("lr_steps", integer(2)),
            lrs=document.get("lrs", _NUMBERS),
            losses=document.get("losses", _NUMBERS),
            smoothed_losses=document.get("smoothed_losses", _NUMBERS),
            stopped_early=document.get("stopped_early", Kind(lambda v: isinstance(v, bool), "true or false")),
            min_loss_lr=document.get("min_loss_lr", _NUMBER),
            steepest_descent_lr=document.get("steepest_descent_lr", _NUMBER),
            suggested_lr=document.get("suggested_lr", _NUMBER),
            rule=document.get("rule", Kind(lambda v: isinstance(v, str), "a string")),
            entry_point=document.get("entry_point", one_of(*ENTRY_POINT_RECIPES)),
            world_size=document.get("world_size", integer(1)),
            config=document.get("config", OBJECT),
        )


def exponential_lrs(lr_min: float, lr_max: float, steps: int) -> list[float]:
    """``steps`` rates from ``lr_min`` to ``lr_max``, each the previous times a constant."""
    return [lr_min * (lr_max / lr_min) ** (i / (steps - 1)) for i in range(steps)]


def smooth(losses: Sequence[float]) -> list[float]:
    """The centred moving average of ``losses``: each the mean of the losses within
    ``WINDOW_FRACTION`` of the steps on either side (fewer at the ends)."""
    half = max(2, round(len(losses) * WINDOW_FRACTION))
    return [
        sum(losses[max(0, i - half) : i + half + 1]) / len(losses[max(0, i - half) : i + half + 1])
        for i in range(len(losses))
    ]


def suggest(lrs: Sequence[float], smoothed: Sequence[float]) -> dict[str, float]:
    """{min_loss_lr, steepest_descent_lr, suggested_lr} of a test's finite smoothed losses."""
    lowest = min(range(len(smoothed)), key=smoothed.__getitem__)
    steepest = 0
    if lowest > 0:
        slopes = [(smoothed[i + 1] - smoothed[i]) / (math.log(lrs[i + 1]) - math.log(lrs[i])) for i in range(lowest)]
        steepest = min(range(len(slopes)), key=slopes.__getitem__)
    return {
        "min_loss_lr": lrs[lowest],
        "steepest_descent_lr": lrs[steepest],
        "suggested_lr": max(lrs[steepest], lrs[lowest] / 10),
    }


def run_range_test(trainer: Trainer, lrs: Sequence[float]) -> dict[str, Any]:
    """Trains one step per rate of ``lrs`` (the data's epochs repeat when it runs out);
    returns {lrs, losses, smoothed_losses, stopped_early} of the steps run. Collective:
    every rank sees the same averaged losses, so all stop at the same step."""
    loader = trainer.loaders["train"]
    if len(loader) == 0:
        raise FlagError("the training split has no batches for the range test")
    trainer.model.train()
    epoch = 0
    loader.set_epoch(epoch, 0)
    batches = trainer._batches(loader)
    losses: list[float] = []
    # A bias-corrected exponential moving average: known while the test runs.
    running, lowest, diverged, non_finite = 0.0, math.inf, False, False
    for step, lr in enumerate(lrs):
        set_lr(trainer.optimizer, lr)
        try:
            loss, _, _ = trainer.train_pipeline.progress(batches)
        except StopIteration:
            epoch += 1
            loader.set_epoch(epoch, 0)
            batches = trainer._batches(loader)
            loss, _, _ = trainer.train_pipeline.progress(batches)
        mean = loss.detach().double()
        if trainer.env.world_size > 1:
            dist.all_reduce(mean)
            mean /= trainer.env.world_size
        value = mean.item()
        if not math.isfinite(value):
            diverged = non_finite = True
            break
        losses.append(value)
        running = SMOOTHING * running + (1 - SMOOTHING) * value
        average = running / (1 - SMOOTHING ** (step + 1))
        lowest = min(lowest, average)
        if step >= WARMUP_STEPS and average > DIVERGED * lowest:
            diverged = True
            break
    smoothed: list[float | None] = list(smooth(losses))
    tail: list[float | None] = [None] if non_finite else []  # the step whose loss was not finite
    return {
        "lrs": list(lrs[: len(losses) + len(tail)]),
        "losses": [*losses, *tail],
        "smoothed_losses": [*smoothed, *tail],
        "stopped_early": diverged,
    }


def draw(result: RangeTestResult, path: str) -> None:
    """Loss and smoothed loss against the rate (log scale), the suggestion marked."""
    with png_figure(path, figsize=FIGURE_INCHES, dpi=FIGURE_DPI) as (fig, ax):
        finite = [
            (lr, loss, s) for lr, loss, s in zip(result.lrs, result.losses, result.smoothed_losses) if loss is not None
        ]
        ax.plot([p[0] for p in finite], [p[1] for p in finite], ".", color="0.7", markersize=3, label="loss per step")
        ax.plot([p[0] for p in finite], [p[2] for p in finite], "-", color="C0", label="smoothed loss")
        ax.axvline(result.min_loss_lr, color="C3", linestyle=":", label=f"minimum: lr {result.min_loss_lr:.3g}")
        ax.axvline(result.suggested_lr, color="C2", linestyle="--", label=f"suggested: lr {result.suggested_lr:.3g}")
        ax.set_xscale("log")
        ax.set_xlabel("learning rate (log scale)")
        ax.set_ylabel("training loss (log loss)")
        # The divergence's tail would squash the part that matters: show the losses below
        # the start and as much again above it.
        start, low = finite[0][2], min(p[1] for p in finite)
        ax.set_ylim(low - 0.1 * (start - low), start + (start - low))
        ax.legend(loc="upper left", fontsize="small")
        ax.grid(alpha=0.3)
        ax.set_title(
            f"learning-rate range test: {result.entry_point}, {len(result.lrs)} steps, {result.world_size} rank(s)",
            fontsize="medium",
        )


def build_range_parser() -> argparse.ArgumentParser:
    """The entry points' flags, plus the range test's."""
    parser = build_parser(
        PROG,
        "Learning-rate range test: train a few hundred steps with an exponentially "
        "growing learning rate and suggest one.",
    )
    group = parser.add_argument_group("learning-rate range test")
    group.add_argument(
        "--entry_point",
        choices=list(ENTRY_POINT_RECIPES),
        default="dlrm_main.py",
        help="whose defaults the other flags start from (the model it tests)",
    )
    group.add_argument("--lr_min", type=float, default=1e-4, help="the first step's learning rate")
    group.add_argument("--lr_max", type=float, default=10.0, help="the last step's learning rate")
    group.add_argument(
        "--lr_steps", type=positive_int, default=200, help="training steps from --lr_min to --lr_max (at least 2)"
    )
    group.add_argument(
        "--lr_range_output",
        default="lr_range_test",
        help="writes OUTPUT.json (every step's lr and loss, the suggestion) and OUTPUT.png (its directory is created)",
    )
    return parser


def range_config(argv: Sequence[str] | None) -> tuple[argparse.Namespace, TrainConfig]:
    """The parsed flags and the training configuration (the ``--entry_point``'s
    defaults under the flags given). Raises FlagError naming the flag."""
    args = build_range_parser().parse_args(argv)
    recipe = ENTRY_POINT_RECIPES[args.entry_point]
    args.entry_point_recipe = recipe.name if recipe else None
    if not (args.lr_min > 0 and math.isfinite(args.lr_max) and args.lr_max > args.lr_min):
        raise FlagError(f"--lr_min and --lr_max must satisfy 0 < lr_min < lr_max, got {args.lr_min} and {args.lr_max}")
    if args.lr_steps < 2:
        raise FlagError(f"--lr_steps must be at least 2, got {args.lr_steps}")
    config = config_from_args(args)
    if config.mode != "train":
        raise FlagError(f"--mode {config.mode}: the range test trains; leave --mode out")
    return args, config


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the range test; returns the exit code (the entry points' codes)."""
    try:
        args, config = range_config(argv)
    except FlagError as e:
        return report_bad_input(PROG, str(e))
    directory = os.path.dirname(os.path.abspath(args.lr_range_output))
    try:  # before the test trains, not after
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        return report_bad_input(
            PROG, f"--lr_range_output {args.lr_range_output}: cannot create the directory {directory} ({e.strerror})"
        )
    lrs = exponential_lrs(args.lr_min, args.lr_max, args.lr_steps)

    def work(trainer: Trainer) -> None:
        run = run_range_test(trainer, lrs)
        trainer.log.close()
        finite = [i for i, s in enumerate(run["smoothed_losses"]) if s is not None]
        if not finite:
            raise NonFiniteLossError(f"training loss is not finite at the first rate, {args.lr_min}: lower --lr_min")
        choice = suggest([run["lrs"][i] for i in finite], [run["smoothed_losses"][i] for i in finite])
        result = RangeTestResult(
            lr_min=args.lr_min,
            lr_max=args.lr_max,
            lr_steps=args.lr_steps,
            **run,
            **choice,
            rule=RULE,
            entry_point=args.entry_point,
            world_size=trainer.env.world_size,
            config=dataclasses.asdict(config),
        )
        if not trainer.env.is_main:
            return
        write_bytes(f"{args.lr_range_output}.json", result.to_json())
        draw(result, f"{args.lr_range_output}.png")
        ended = (
            f"stopped at step {len(result.lrs)} of {args.lr_steps} (the loss diverged)"
            if result.stopped_early
            else f"{args.lr_steps} steps"
        )
        print(
            f"learning-rate range test, {ended}: smoothed loss lowest at lr {result.min_loss_lr:.3g}, "
            f"steepest descent at lr {result.steepest_descent_lr:.3g}\n"
            f"suggested --learning_rate {result.suggested_lr:.3g} ({RULE})\n"
            f"wrote {args.lr_range_output}.json, {args.lr_range_output}.png",
            flush=True,
        )

    return run_with_trainer(config, PROG, work)


if __name__ == "__main__":
    sys.exit(main())
