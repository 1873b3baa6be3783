"""A newcomer's first command: the public example's defaults (fused SGD at 15) diverge
on most small runs; the run stops within a few steps and says which flags train."""

import re
import shlex

import pytest

from harness.launch import run_script
from tests.training.test_recipes_stable_start import make_train_flags
from training.config import OptimizerConfig
from training.recipes import STABLE_OPTIMIZER
from training.trainer import DIVERGENCE_WATCH_STEPS, divergence_advice

SMALL_MODEL = [
    "--batch_size",
    "256",
    "--embedding_dim",
    "16",
    "--dense_arch_layer_sizes",
    "64,16",
    "--over_arch_layer_sizes",
    "64,1",
]


def test_makefile_train_flags_hold_the_advised_optimizer_flags():
    """One fact, two places: the flags a diverging run advises are make train's."""
    advised = " ".join(f"{name} {value}" for name, value in STABLE_OPTIMIZER.options().items())
    assert advised in " ".join(make_train_flags())


def test_advice_names_the_public_defaults_only_when_they_are_used():
    assert divergence_advice(OptimizerConfig()) == (
        "the likely cause is the public example's defaults (--learning_rate 15.0 --optimizer sgd); "
        "these train: --learning_rate 0.05 --optimizer adagrad"
    )
    for changed in (OptimizerConfig(learning_rate=1.0), OptimizerConfig(optimizer="adagrad")):
        assert divergence_advice(changed) == "lower --learning_rate or check the input data"


@pytest.mark.slow
def test_public_defaults_stop_within_a_few_steps(synthetic_dir):
    """docs/benchmarks.md's small model with the public defaults: the loss is NaN at
    step 5; the run stops there (exit 3), not at the end of the first logged interval
    (step 100), and its last line names the defaults and the flags that train."""
    proc = run_script(
        [
            "dlrm_main.py",
            "--in_memory_binary_criteo_path",
            synthetic_dir,
            *SMALL_MODEL,
            "--limit_train_batches",
            str(DIVERGENCE_WATCH_STEPS),
            "--print_lr",
        ]
    )
    assert proc.returncode == 3, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    match = re.fullmatch(
        r"dlrm_main\.py: error: training loss is (nan|inf|-inf) at step (\d+) \(epoch 0\): "
        r"the likely cause is the public example's defaults \(--learning_rate 15\.0 --optimizer sgd\); "
        r"these train: (.*)",
        last,
    )
    assert match, last
    # --print_lr prints a line after each step that passed the check: none after the bad one.
    assert len(re.findall(r"^step \d+: lr ", proc.stdout + proc.stderr, re.M)) == int(match.group(2))
    assert shlex.split(match.group(3)) == ["--learning_rate", "0.05", "--optimizer", "adagrad"]
