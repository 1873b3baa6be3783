"""Bad input against failures: every CLI turns BadInput into one line and exit code 2
(common.cli.run_cli); any other exception, a ValueError from inside torch included,
is a failure with its traceback (exit 1)."""

import pytest
import torch
import torch.distributed as dist

import dlrm_main
from common.errors import EXIT_BAD_INPUT, BadInput, RankError
from data.batching.value_checks import DataValueError
from tests.support.cli_modules import cli_modules, run_as_main
from training.failures import report_rank_failure

MISSING = "/nonexistent/errors_test"

# One bad flag value per CLI that argparse accepts and the command refuses: it reaches
# run_cli as BadInput. (module or script, argv, text the line must hold)
BAD_FLAG_VALUES = {
    "dlrm_main.py": (["--sharding_plan", f"{MISSING}/plan.json"], f"{MISSING}/plan.json"),
    "dcnv2_main.py": (["--sharding_plan", f"{MISSING}/plan.json"], f"{MISSING}/plan.json"),
    "data.criteo_feature_spec": (["--input", MISSING, "--output", "{tmp}/out"], MISSING),
    "data.histories": (
        ["--parquet_path", MISSING, "--output_dir", "{tmp}/out", "--user_column", "u", "--item_column", "i"]
        + ["--time_column", "t"],
        MISSING,
    ),
    "data.preprocess_criteo": (
        ["--input_dir", MISSING, "--output_dir", "{tmp}/out", "--dataset_name", "criteo_1t"],
        MISSING,
    ),
    "data.profile": (["--parquet_path", MISSING], MISSING),
    "data.synthetic_criteo": (["--output_dir", "{tmp}/out", "--num_days", "1"], "--num_days"),
    "data.synthetic_csv": (["--output", "{tmp}/out", "--cardinality", "many"], "--cardinality"),
    "data.synthetic_parquet": (["--output_dir", "{tmp}/out", "--start_date", "tomorrow"], "--start_date"),
    "data.synthetic_histories": (["--output_dir", "{tmp}/out", "--start_date", "tomorrow"], "--start_date"),
    "data.transcode": (["--input", MISSING, "--output", "{tmp}/out"], MISSING),
    "sharding_plans": (["plan", "--preset", "no_such_preset"], "no_such_preset"),
    "sweeps": (["run", f"{MISSING}/sweep.yaml"], f"{MISSING}/sweep.yaml"),
    "serving.export": (["--checkpoint", MISSING, "--output", "{tmp}/model"], MISSING),
    "serving.predict": (["--model", MISSING, "--input", "{tmp}/rows.tsv"], MISSING),
    "serving.quality_gate": (["--model", MISSING], MISSING),
    "serving.serve": (["--model", MISSING, "--port", "70000"], "--port 70000"),
    "training.baseline": (["--in_memory_binary_criteo_path", MISSING], MISSING),
    "training.daily": (
        ["--state_dir", "{tmp}/state", "--parquet_path", MISSING, "--time_column", "date", "--sparse_columns", "C*"],
        MISSING,
    ),
    "training.launch": (["--standalone", f"{MISSING}/train.py"], f"{MISSING}/train.py"),
    "training.lr_finder": (["--in_memory_binary_criteo_path", MISSING], MISSING),
    "training.report": ([f"{MISSING}/log.jsonl", "--output", "{tmp}/run.png"], f"{MISSING}/log.jsonl"),
}


def test_every_cli_has_a_bad_flag_case():
    """A new CLI must join the list below (and so be checked to go through the wrapper)."""
    assert cli_modules() == sorted(BAD_FLAG_VALUES)


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")  # runpy re-runs imported modules
@pytest.mark.parametrize("target", sorted(BAD_FLAG_VALUES))
def test_bad_flag_value_is_one_line_and_exit_2(target, tmp_path, monkeypatch, capsys):
    argv, expected = BAD_FLAG_VALUES[target]
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    code = run_as_main(target, [a.replace("{tmp}", str(tmp_path)) for a in argv], monkeypatch)
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT, err
    lines = err.splitlines()
    assert len(lines) == 1 and ": error: " in lines[0] and expected in lines[0], err
    assert "Traceback" not in err


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")  # runpy re-runs imported modules
@pytest.mark.parametrize("target", cli_modules())
def test_no_cli_takes_a_prefix_of_a_flag(target, tmp_path, monkeypatch, capsys):
    """``--versio`` is a prefix of the ``--version`` every CLI has: argparse's default
    would print the version (as it read ``--learning_rat 0.5`` as ``--learning_rate``).
    The CLIs are found, not listed; the bad-value cases give their required flags."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in BAD_FLAG_VALUES.get(target, ([], ""))[0]]
    # The launcher's own flags come before its script: what follows is the script's.
    argv = ["--versio", *argv] if target == "training.launch" else [*argv, "--versio"]
    code = run_as_main(target, argv, monkeypatch)
    out, err = capsys.readouterr()
    assert code == EXIT_BAD_INPUT and out == "", out
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].endswith("error: unrecognized arguments: --versio"), err


def test_a_training_flag_prefix_is_refused(capsys):
    with pytest.raises(SystemExit) as stopped:
        dlrm_main.main(["--learning_rat", "0.5"])  # the typo that trained at rate 0.5
    assert stopped.value.code == EXIT_BAD_INPUT
    assert "unrecognized arguments: --learning_rat 0.5" in capsys.readouterr().err


def test_value_error_inside_torch_during_setup_is_a_failure_with_traceback(monkeypatch, capsys):
    """A ValueError that torch raises while the trainer is set up is not the user's bad
    input: exit 1, the traceback, and the one line that names the rank and the stage."""

    def seed_fails(seed):
        raise ValueError("raised inside torch.manual_seed")

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.setattr(torch, "manual_seed", seed_fails)  # the trainer seeds the model's init with it
    try:
        code = dlrm_main.main(["--num_embeddings", "100", "--limit_train_batches", "1"])
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    err = capsys.readouterr().err
    assert code == 1, err
    assert "Traceback (most recent call last)" in err and "ValueError: raised inside torch.manual_seed" in err
    assert err.splitlines()[-1] == (
        "dlrm_main.py: error: rank 0 of 1 failed at setup: ValueError: raised inside torch.manual_seed"
    )


@pytest.mark.parametrize(
    "error, one_line",
    [
        (RankError("saving checkpoint /ckpt/step_10 failed: [Errno 28] No space left on device"), True),
        (DataValueError("day_0_labels.npy row 7 column label: label 2 is not 0 or 1"), True),
        (BadInput("/data/day_1.parquet: not a Parquet file"), True),  # bad input only this rank read
        (ValueError("raised inside torch"), False),
    ],
)
def test_a_rank_failure_has_a_traceback_unless_its_message_says_all(monkeypatch, capsys, error, one_line):
    """A rank's failure is one line when its message says what and where (a RankError,
    bad input that only this rank found, a data value among it); any other exception
    comes with its traceback. Exit 1 either way: the other ranks did not see it."""
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    try:
        raise error
    except Exception as raised:  # with a traceback, as the trainer's are
        code = report_rank_failure("dlrm_main.py", 1, 2, "step 37 (epoch 0, training)", raised)
    err = capsys.readouterr().err
    line = f"dlrm_main.py: error: rank 1 of 2 failed at step 37 (epoch 0, training): {type(error).__name__}: {error}"
    assert code == 1 and err.splitlines()[-1] == line
    assert (err == line + "\n") if one_line else ("Traceback (most recent call last)" in err), err


def test_bad_input_during_setup_is_one_line_and_exit_2(monkeypatch, capsys):
    """The same stage with bad input (a plan file that is not there): exit 2, one line, no traceback."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    code = dlrm_main.main(["--num_embeddings", "100", "--sharding_plan", f"{MISSING}/plan.json"])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT and len(err.splitlines()) == 1, err
    assert err.startswith("dlrm_main.py: error: ") and f"{MISSING}/plan.json" in err
