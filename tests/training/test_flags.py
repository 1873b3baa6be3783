"""Flag parsing and validation: every bad input is one line on stderr and exit code 2."""

import json
import subprocess
import sys

import pytest

import dcnv2_main
import dlrm_main
from data.binary.criteo_layout import NUM_SPARSE_FEATURES
from harness.launch import REPO
from training.flags import parse_config
from training.recipes import DCNV2


def run_main(capsys, main, argv):
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    return code, [line for line in err.splitlines() if line.strip()]


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--dense_arch_layer_sizes", "512,256,32"],
            "last --dense_arch_layer_sizes value (32) must equal --embedding_dim (64)",
        ),
        (["--over_arch_layer_sizes", "512,2"], "--over_arch_layer_sizes must end in 1"),
        (
            ["--num_embeddings_per_feature", "10,20"],
            f"--num_embeddings_per_feature has 2 values but the data has {NUM_SPARSE_FEATURES}",
        ),
        (
            ["--num_embeddings_per_feature", ",".join(["10"] * (NUM_SPARSE_FEATURES - 1) + ["0"])],
            "value 25 (cat_25) must be positive",
        ),
        (["--num_embeddings", "-5"], "--num_embeddings must be positive, got -5"),
        (["--max_table_rows", "0"], "--max_table_rows must be positive, got 0"),
        (["--max_table_rows", "1k"], "argument --max_table_rows: invalid int value: '1k'"),
        (["--embedding_dim", "0", "--dense_arch_layer_sizes", "512,0"], "--embedding_dim must be positive"),
        (["--dense_arch_layer_sizes", "512,-1,64"], "--dense_arch_layer_sizes sizes must be positive"),
        (["--dense_arch_layer_sizes", "512,,64"], "malformed list '512,,64'"),
        (["--over_arch_layer_sizes", "a,b"], "malformed list 'a,b'"),
        (["--batch_size", "0"], "--batch_size must be positive"),
        (["--epochs", "0"], "--epochs must be positive"),
        (["--learning_rate", "-1"], "--learning_rate must be positive"),
        (["--interaction_type", "dcn", "--dcn_low_rank_dim", "0"], "--dcn_low_rank_dim must be positive"),
        (
            ["--interaction_type", "projection", "--interaction_branch1_layer_sizes", "100,30"],
            "must be a multiple of --embedding_dim",
        ),
        (["--in_memory_binary_criteo_path", "/no/such/dir"], "/no/such/dir: no such directory"),
        (["--multi_hot_sizes", "3,3"], f"--multi_hot_sizes has 2 values but the data has {NUM_SPARSE_FEATURES}"),
        (
            ["--multi_hot_sizes", ",".join(["2"] * (NUM_SPARSE_FEATURES - 1) + ["0"])],
            "--multi_hot_sizes values must be positive",
        ),
        (["--multi_hot_distribution_type", "pareto"], "--multi_hot_distribution_type needs --multi_hot_sizes"),
        (
            ["--synthetic_multi_hot_criteo_path", "/no/such/mh"],
            "--synthetic_multi_hot_criteo_path /no/such/mh: no such directory",
        ),
        (["--no_such_flag"], "unrecognized arguments: --no_such_flag"),
        (["--interaction_type", "bogus"], "invalid choice: 'bogus'"),
        (["--adagrad", "--optimizer", "sgd"], "--adagrad contradicts --optimizer sgd"),
        (
            ["--lr_warmup_steps", "10", "--lr_decay_start", "5", "--lr_decay_steps", "5"],
            "--lr_decay_start (5) must not come before the end of warm-up",
        ),
        (["--warm_start_optimizer"], "--warm_start_optimizer needs --warm_start"),
        (
            ["--warm_start", "day_01", "--restore_checkpoint_path", "day_01"],
            "give --warm_start (a new run from a checkpoint's weights) or --restore_checkpoint_path "
            "(the weights of this run's model), not both",
        ),
        (
            ["--warm_start", "day_01", "--mode", "test", "--checkpoint_dir", "day_02"],
            "--warm_start starts a training run: --mode test takes a checkpoint with --restore_checkpoint_path",
        ),
        (
            ["--warm_start", "day_01/step_000000004", "--checkpoint_dir", "./day_01/"],
            "--warm_start day_01/step_000000004 starts a new run: give it a --checkpoint_dir of its own, "
            "not ./day_01/, which holds the checkpoint it starts from",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, argv, message):
    code, lines = run_main(capsys, dlrm_main.main, argv)
    assert code == 2
    assert len(lines) == 1, lines
    assert lines[0].startswith("dlrm_main.py: error: ") and message in lines[0], lines[0]


def test_public_example_flags_parse():
    config = parse_config(
        [
            "--epochs",
            "2",
            "--batch_size",
            "64",
            "--drop_last_training_batch",
            "--test_batch_size",
            "128",
            "--limit_train_batches",
            "5",
            "--limit_val_batches",
            "6",
            "--limit_test_batches",
            "7",
            "--dataset_name",
            "criteo_kaggle",
            "--num_embeddings",
            "50",
            "--embedding_dim",
            "32",
            "--dense_arch_layer_sizes",
            "64,32",
            "--over_arch_layer_sizes",
            "16,1",
            "--interaction_branch1_layer_sizes",
            "64",
            "--interaction_branch2_layer_sizes",
            "64",
            "--dcn_num_layers",
            "2",
            "--dcn_low_rank_dim",
            "8",
            "--interaction_type",
            "projection",
            "--seed",
            "5",
            "--pin_memory",
            "--mmap_mode",
            "--learning_rate",
            "0.5",
            "--shuffle_batches",
            "--shuffle_training_set",
            "--validation_freq_within_epoch",
            "9",
            "--adagrad",
            "--lr_warmup_steps",
            "1",
            "--lr_decay_start",
            "2",
            "--lr_decay_steps",
            "3",
            "--print_lr",
            "--allow_tf32",
            "--print_sharding_plan",
        ],
        "dlrm_main.py",
        "",
    )
    assert config.model.num_embeddings_per_feature == [50] * NUM_SPARSE_FEATURES
    assert config.model.interaction_type == "projection"
    assert config.optim.optimizer == "adagrad" and config.optim.resolved_dense_optimizer == "adagrad"
    assert config.data.eval_batch_size == 128 and config.data.limit("test") == 7
    assert config.seed == config.data.seed == 5
    assert (config.data.shuffle_batches, config.data.shuffle_training_set, config.data.mmap_mode) == (True, True, True)


def test_dcnv2_defaults_and_overrides():
    from training.flags import config_from_args, entry_point_parser

    parser = entry_point_parser("dcnv2_main.py")
    args = config_from_args(parser.parse_args([])).model
    assert args.interaction_type == "dcn" and args.embedding_dim == 128
    assert args.dense_arch_layer_sizes == [512, 256, 128]
    assert args.over_arch_layer_sizes == [1024, 1024, 512, 256, 1]
    assert (args.interaction.dcn_num_layers, args.interaction.dcn_low_rank_dim) == (3, 512)
    args = config_from_args(
        parser.parse_args(["--embedding_dim", "64", "--dense_arch_layer_sizes", "128,64", "--dcn_num_layers", "1"])
    ).model
    assert (args.embedding_dim, args.dense_arch_layer_sizes, args.interaction.dcn_num_layers) == (64, [128, 64], 1)


def test_dcnv2_entry_point_validates_with_its_defaults(capsys):
    code, lines = run_main(capsys, dcnv2_main.main, ["--embedding_dim", "64"])
    assert code == 2 and "must equal --embedding_dim (64)" in lines[0]


def test_table_sizes_come_from_metadata(synthetic_dir):
    from harness.small_data import SMALL_SPEC

    config = parse_config(["--in_memory_binary_criteo_path", synthetic_dir], "dlrm_main.py", "")
    assert config.model.num_embeddings_per_feature == SMALL_SPEC.cardinalities
    config = parse_config(
        ["--in_memory_binary_criteo_path", synthetic_dir, "--num_embeddings", "77"], "dlrm_main.py", ""
    )
    assert config.model.num_embeddings_per_feature == [77] * NUM_SPARSE_FEATURES


@pytest.mark.parametrize("argv", [["--batch_size", "0"], ["--no_such_flag"]])
def test_bad_flags_are_said_by_rank_0_of_the_job(capsys, monkeypatch, tmp_path, argv):
    """Every rank sees the same flags: rank 0 prints the line; every rank exits 2 and
    records it for torchrun's failure summary."""
    for rank, printed in (("1", 0), ("0", 1)):
        error_file = tmp_path / f"rank_{rank}.json"
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
        code, lines = run_main(capsys, dlrm_main.main, argv)
        assert (code, len(lines)) == (2, printed), lines
        message = json.loads(error_file.read_text())["message"]
        assert message.startswith("dlrm_main.py: ") and message.endswith(" (exit code 2)")


@pytest.mark.parametrize("main", [dlrm_main.main, dcnv2_main.main])
def test_max_table_rows_caps_every_table_however_sized(synthetic_dir, main):
    """The cap applies to the data's cardinalities and to explicit sizes alike, in both
    entry points; the loaders then take the data's ids modulo the capped tables."""
    from data.batching.loaders import build_loaders
    from data.sources import source_for
    from harness.small_data import SMALL_SPEC

    prog = "dlrm_main.py" if main is dlrm_main.main else "dcnv2_main.py"
    defaults = None if main is dlrm_main.main else DCNV2
    data = ["--in_memory_binary_criteo_path", synthetic_dir]
    config = parse_config([*data, "--max_table_rows", "100"], prog, "", defaults)
    assert config.model.num_embeddings_per_feature == [min(c, 100) for c in SMALL_SPEC.cardinalities]
    assert max(SMALL_SPEC.cardinalities) > 100 and min(SMALL_SPEC.cardinalities) < 100
    assert config.max_table_rows == 100
    sizes = [5, 500] * (NUM_SPARSE_FEATURES // 2)
    config = parse_config(
        [*data, "--num_embeddings_per_feature", ",".join(map(str, sizes)), "--max_table_rows", "100"],
        prog,
        "",
        defaults,
    )
    assert config.model.num_embeddings_per_feature == [5, 100] * (NUM_SPARSE_FEATURES // 2)
    config = parse_config([*data, "--num_embeddings", "50", "--max_table_rows", "100"], prog, "", defaults)
    assert config.model.num_embeddings_per_feature == [50] * NUM_SPARSE_FEATURES
    uncapped = parse_config(data, prog, "", defaults)
    assert uncapped.max_table_rows is None and uncapped.model.num_embeddings_per_feature == SMALL_SPEC.cardinalities

    config = parse_config(
        [*data, "--max_table_rows", "100", "--batch_size", "512", "--limit_train_batches", "4"], prog, "", defaults
    )
    loader = build_loaders(
        config.data, source_for(config.data).open(), config.model.num_embeddings_per_feature, rank=0, world_size=1
    )["train"]
    seen = [0] * NUM_SPARSE_FEATURES
    for batch in loader:
        for f, name in enumerate(config.model.sparse_feature_names):
            seen[f] = max(seen[f], int(batch.sparse_features[name].values().max()))
    assert all(s < rows for s, rows in zip(seen, config.model.num_embeddings_per_feature))
    assert max(seen) == 99  # the data's larger ids, folded into the capped tables


@pytest.mark.parametrize(
    "module, argv, message",
    [
        (
            "data.transcode",
            ["--input", "x", "--output", "y", "--chunk_size", "0"],
            "python -m data.transcode: error: argument --chunk_size: must be positive, got 0",
        ),
        (
            "data.criteo_feature_spec",
            ["--input", "x", "--output", "y", "--chunk_size", "ten"],
            "python -m data.criteo_feature_spec: error: argument --chunk_size: expected an integer, got 'ten'",
        ),
        (
            "data.synthetic_criteo",
            ["--output_dir", "x", "--cardinalities", "4,,5"],
            "python -m data.synthetic_criteo: error: argument --cardinalities: malformed list '4,,5': empty item",
        ),
        (
            "data.preprocess_criteo",
            [
                "--input_dir",
                "x",
                "--output_dir",
                "y",
                "--dataset_name",
                "criteo_1t",
                "--num_embeddings_per_feature",
                "10,x",
            ],
            "preprocess_criteo: error: argument --num_embeddings_per_feature: malformed list '10,x': expected "
            "comma-separated integers",
        ),
        (
            "data.synthetic_csv",
            ["--output", "x", "--seed", "a"],
            "python -m data.synthetic_csv: error: argument --seed: invalid int value: 'a'",
        ),
        (
            "serving.predict",
            ["--model", "m"],
            "python -m serving.predict: error: the following arguments are required: --input",
        ),
        (
            "serving.export",
            ["--checkpoint", "c", "--output", "o", "--quantize", "int4"],
            "python -m serving.export: error: argument --quantize: unknown table precision 'int4': use fp16, int8, "
            "fp16,int8 or none",
        ),
        (
            "serving.serve",
            ["--model", "m", "--port", "http"],
            "python -m serving.serve: error: argument --port: invalid int value: 'http'",
        ),
        ("training.report", [], "training.report: error: the following arguments are required: logs"),
    ],
)
def test_every_cli_reports_a_bad_flag_in_one_line(capsys, module, argv, message):
    """The data, export, serving and report CLIs share the entry points' one-line parser."""
    main = __import__(module, fromlist=["main"]).main
    assert run_main(capsys, main, argv) == (2, [message])


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv, code, says",
    [
        (["--help"], 0, "usage: dlrm_main.py"),
        (["--batch_size", "0"], 2, "dlrm_main.py: error: --batch_size must be positive, got 0"),
    ],
)
def test_help_and_bad_flags_answer_before_torch_loads(argv, code, says):
    """Loading torch and torchrec takes seconds: --help and bad flags do not wait for it."""
    probe = (
        "import sys, dlrm_main\n"
        "try:\n    code = dlrm_main.main(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\n"
        "print('torch loaded:', 'torch' in sys.modules, file=sys.stderr)\nsys.exit(code)"
    )
    proc = subprocess.run([sys.executable, "-c", probe, *argv], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == code and says in proc.stdout + proc.stderr
    assert proc.stderr.strip().endswith("torch loaded: False")
