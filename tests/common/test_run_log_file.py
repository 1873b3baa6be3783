"""The run log's one reader (common/run_log_file.py): what RunLog writes reads back as
typed records, and a broken line is one error naming the file and line."""

import pytest

from common.errors import BadInput
from common.run_log_file import RunRecord, log_records, read_run_log
from training.run_log import RunLog


def test_what_run_log_writes_reads_back_as_typed_records(tmp_path):
    path = tmp_path / "run.jsonl"
    log = RunLog(True, str(path), progress=False)
    log.record("config", world_size=2)
    log.record("eval", stage="test", step=4, auroc=0.75)
    log.close()
    with open(path, "a") as f:
        f.write("\n")  # a blank line is skipped, not a record
    records = read_run_log(str(path))
    assert [type(r) for r in records] == [RunRecord, RunRecord]
    assert [(r.event, r.line) for r in records] == [("config", 1), ("eval", 2)]
    assert records[1]["auroc"] == 0.75 and records[1] == {**records[1]}  # every field as written, a dict
    assert records[0].run_id == records[1].run_id and isinstance(records[0].run_id, str)
    assert isinstance(records[0].time, float) and records[0].time > 1.6e9
    assert [(n, r.event) for n, r in log_records(str(path))] == [(1, "config"), (2, "eval")]


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"event": "config"}\n{"event": "train", ', "line 2: not JSON"),
        ('{"event": "config"}\n[1, 2]\n', 'line 2: not a training log record (no "event")'),
        ('{"step": 1}\n', 'line 1: not a training log record (no "event")'),
    ],
)
def test_a_broken_line_is_one_error_naming_the_file_and_line(tmp_path, text, message):
    path = tmp_path / "run.jsonl"
    path.write_text(text)
    with pytest.raises(BadInput) as refused:
        read_run_log(str(path))
    assert str(refused.value).startswith(f"{path} {message}")


def test_a_missing_log_is_one_error_of_the_type_asked(tmp_path):
    with pytest.raises(ValueError, match=r"nope.jsonl: cannot read \(No such file or directory\)"):
        read_run_log(str(tmp_path / "nope.jsonl"), ValueError)
