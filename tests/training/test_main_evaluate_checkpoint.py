"""--mode test|validate evaluates a checkpoint with the configuration it records: the
training command line is not needed again, flags given override it, and the metrics
carry the checkpoint's step."""

import pytest

import dlrm_main
from checkpoints.meta import CheckpointMeta
from common.json_fields import FileFieldError
from data.config import DataConfig
from harness.launch import eval_record, launch, read_log
from models.config import ModelConfig

# A model the defaults do not describe (dim 16, small MLPs), 12 steps, 3 test batches.
TRAINING = [
    "--batch_size",
    "128",
    "--embedding_dim",
    "16",
    "--dense_arch_layer_sizes",
    "64,16",
    "--over_arch_layer_sizes",
    "64,1",
    "--optimizer",
    "adagrad",
    "--learning_rate",
    "0.05",
    "--limit_train_batches",
    "12",
    "--limit_val_batches",
    "2",
    "--limit_test_batches",
    "3",
]


@pytest.mark.parametrize(
    "section, config_class, value, message",
    [
        (
            "data",
            DataConfig,
            {"batch_size": "128"},
            'ckpt/meta.json: config.data.batch_size must be an integer, got "128"',
        ),
        (
            "model",
            ModelConfig,
            {"interaction_type": "exec"},
            'ckpt/meta.json: config.model.interaction_type must be one of original, dcn, projection, got "exec"',
        ),
        (
            "data",
            DataConfig,
            {"source_options": {"dataset_path": ["a"]}},
            "ckpt/meta.json: config.data.source_options.dataset_path must be a string or null",
        ),
    ],
)
def test_recorded_flags_are_checked_against_their_flags(section, config_class, value, message):
    """--mode test takes flags from a checkpoint a user hands over: each value must be
    what its flag parses to, one line naming the file and the field otherwise."""
    meta = CheckpointMeta(
        step=1,
        epoch=0,
        batch_in_epoch=1,
        world_size=1,
        config={section: value},
        plan={},
        data_source=None,
        data_features=None,
    )
    with pytest.raises(FileFieldError) as error:
        meta.flag_values(section, config_class, "ckpt/meta.json")
    assert str(error.value).startswith(message)


def test_recorded_flags_leave_out_nulls():
    meta = CheckpointMeta(
        step=1,
        epoch=0,
        batch_in_epoch=1,
        world_size=1,
        plan={},
        data_source=None,
        data_features=None,
        config={"data": {"batch_size": 64, "limit_test_batches": None, "seed": 3}},
    )
    assert meta.flag_values("data", DataConfig, "meta.json") == {"batch_size": 64}  # seed: not a flag


@pytest.mark.slow
def test_mode_test_takes_the_checkpoint_configuration(synthetic_dir, tmp_path):
    ckpt, log = str(tmp_path / "ckpt"), str(tmp_path / "train.jsonl")
    assert launch(
        dlrm_main.main,
        ["--in_memory_binary_criteo_path", synthetic_dir, *TRAINING, "--checkpoint_dir", ckpt, "--log_path", log],
        nproc=1,
    ) == {0: 0}
    trained = eval_record(read_log(log), "test")
    # Only the checkpoint: data, model, table sizes and batch limits come from it.
    only = str(tmp_path / "only.jsonl")
    assert launch(dlrm_main.main, ["--mode", "test", "--checkpoint_dir", ckpt, "--log_path", only], nproc=1) == {0: 0}
    tested = eval_record(read_log(only), "test")
    assert tested["step"] == 12  # the checkpoint's, not 0
    assert tested["num_samples"] == trained["num_samples"] == 3 * 128
    assert tested["auroc"] == pytest.approx(trained["auroc"], abs=1e-6)
    # A flag given overrides what the checkpoint records.
    fewer = str(tmp_path / "fewer.jsonl")
    assert launch(
        dlrm_main.main,
        ["--mode", "test", "--checkpoint_dir", ckpt, "--limit_test_batches", "1", "--log_path", fewer],
        nproc=1,
    ) == {0: 0}
    assert eval_record(read_log(fewer), "test")["num_samples"] == 128
