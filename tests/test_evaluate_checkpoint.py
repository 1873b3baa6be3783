"""--mode test|validate evaluates a checkpoint with the configuration it records: the
training command line is not needed again, flags given override it, and the metrics
carry the checkpoint's step."""

import pytest

import dlrm_main
from tests.support.launch import eval_record, launch, read_log

pytestmark = pytest.mark.slow  # training and evaluation runs

# A model the defaults do not describe (dim 16, small MLPs), 12 steps, 3 test batches.
TRAINING = ["--batch_size", "128", "--embedding_dim", "16", "--dense_arch_layer_sizes", "64,16",
            "--over_arch_layer_sizes", "64,1", "--optimizer", "adagrad", "--learning_rate", "0.05",
            "--limit_train_batches", "12", "--limit_val_batches", "2", "--limit_test_batches", "3"]


def test_mode_test_takes_the_checkpoint_configuration(synthetic_dir, tmp_path):
    ckpt, log = str(tmp_path / "ckpt"), str(tmp_path / "train.jsonl")
    assert launch(dlrm_main.main, ["--in_memory_binary_criteo_path", synthetic_dir, *TRAINING,
                                   "--checkpoint_dir", ckpt, "--log_path", log], nproc=1) == {0: 0}
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
    assert launch(dlrm_main.main, ["--mode", "test", "--checkpoint_dir", ckpt, "--limit_test_batches", "1",
                                   "--log_path", fewer], nproc=1) == {0: 0}
    assert eval_record(read_log(fewer), "test")["num_samples"] == 128
