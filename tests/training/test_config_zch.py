"""--id_hashing zch at the flags (training/config.py): the model gets the managed-collision
options; one line and exit 2 where this stack's torchrec lacks the modules, for a step
cadence of checkpoints off the admissions, and the zch flags' own checks."""

import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from training.flags import parse_config


@pytest.fixture
def lake(tmp_path):
    path = str(tmp_path / "clicks.parquet")
    pq.write_table(pa.table({"label": [0, 1], "I1": [1.0, 2.0], "C1": ["a", "b"]}), path)
    return path


def _refusal(capsys, lake, *flags):
    argv = ["--parquet_path", lake, "--dense_columns", "I1", "--sparse_columns", "C1", "--id_hashing", "zch", *flags]
    with pytest.raises(SystemExit) as stop:
        parse_config(argv, "dlrm_main.py", "")
    err = capsys.readouterr().err.strip().splitlines()
    return stop.value.code, err


def test_zch_gives_the_model_its_options(lake):
    argv = ["--parquet_path", lake, "--dense_columns", "I1", "--sparse_columns", "C1", "--id_hashing", "zch"]
    config = parse_config([*argv, "--zch_eviction_policy", "lru", "--zch_eviction_interval", "5"], "dlrm_main.py", "")
    assert (config.model.zch_eviction_policy, config.model.zch_eviction_interval) == ("lru", 5)
    plain = parse_config(argv[:-2], "dlrm_main.py", "")
    assert plain.model.zch_eviction_policy is None


def test_a_checkpoint_cadence_off_the_admissions_is_refused(lake, capsys, tmp_path):
    flags = ["--zch_eviction_interval", "4", "--checkpoint_dir", str(tmp_path / "ck"), "--checkpoint_every_n_steps"]
    code, err = _refusal(capsys, lake, *flags, "6")
    assert code == 2 and len(err) == 1, err
    assert "--checkpoint_every_n_steps 6 must be a multiple of --zch_eviction_interval 4" in err[0]
    assert (
        parse_config(
            [
                "--parquet_path",
                lake,
                "--dense_columns",
                "I1",
                "--sparse_columns",
                "C1",
                "--id_hashing",
                "zch",
                *flags,
                "8",
            ],
            "dlrm_main.py",
            "",
        ).checkpoint.checkpoint_every_n_steps
        == 8
    )


def test_zch_on_a_torchrec_without_managed_collision_modules(lake, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchrec.modules.mc_modules", None)
    code, err = _refusal(capsys, lake)
    assert code == 2 and len(err) == 1, err
    assert "--id_hashing zch needs torchrec's managed-collision modules, which torchrec " in err[0]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--zch_eviction_interval", "0"], "--zch_eviction_interval must be at least 1, got 0"),
        (["--zch_eviction_policy", "fifo"], "--zch_eviction_policy"),
        (["--sharding_type", "table_wise"], "--sharding_type table_wise (t_C1): --id_hashing zch tables are sharded"),
        (
            ["--optimizer", "rowwise_adagrad", "--device", "cpu"],
            "--optimizer rowwise_adagrad with --id_hashing zch on CPU: FBGEMM has no CPU kernel to reset",
        ),
    ],
)
def test_bad_zch_flags(lake, capsys, flags, message):
    code, err = _refusal(capsys, lake, *flags)
    assert code == 2 and len(err) == 1 and message in err[0], err
