"""--id_hashing zch at the flags (training/config.py): one line and exit 2, whether this
stack's torchrec lacks the managed-collision modules or has them (models/zch.py is not
trained by this release yet), and the zch flags' own checks."""

import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from models.zch import ZCH_NOT_WIRED
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


def test_zch_is_refused_with_one_line_saying_why(lake, capsys):
    code, err = _refusal(capsys, lake)
    assert code == 2 and len(err) == 1 and err[0].endswith(ZCH_NOT_WIRED), err


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
    ],
)
def test_bad_zch_flags(lake, capsys, flags, message):
    code, err = _refusal(capsys, lake, *flags)
    assert code == 2 and len(err) == 1 and message in err[0], err
