"""bench/daily_loop.py --summarize on a stopped run: the days both sides finished are
compared (a day one side has not finished is left out), and the totals are those
days' sums. The run's logs are written here in the trainer's record format (the runs
themselves take minutes; `--days 5 --rows_per_day 2000` is the bench's quick check)."""

import json
import os

from bench import daily_loop
from data.synthetic_parquet import SyntheticParquetSpec, generate_synthetic_parquet


def _log(path: str, records: list[dict]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def test_summarize_compares_the_days_both_sides_finished(tmp_path, capsys):
    spec = SyntheticParquetSpec(days=6, rows_per_day=40, files_per_day=1, multi_hot_columns=0)
    generate_synthetic_parquet(spec, str(tmp_path / "lake"))
    days = [spec.day(d).isoformat() for d in range(spec.days)]
    # The loop trained days 0..2 (scoring 1..3) and is training day 3: no summary yet.
    for k, (auroc, seconds) in enumerate([(0.60, 1.0), (0.70, 2.0), (0.65, 3.0)]):
        _log(
            str(tmp_path / "loop" / "days" / days[k] / "train.jsonl"),
            [
                {"event": "eval", "stage": "validation", "window": 1, "auroc": auroc},
                {"event": "summary", "train_seconds": seconds},
            ],
        )
    _log(str(tmp_path / "loop" / "days" / days[3] / "train.jsonl"), [{"event": "train", "step": 1}])
    # The from-scratch runs scored days 1..4; day 4's loop side is not done.
    for scored, auroc, seconds in [(days[1], 0.60, 10.0), (days[2], 0.68, 20.0), (days[3], 0.66, 30.0)]:
        _log(
            str(tmp_path / "scratch" / scored / "train.jsonl"),
            [
                {"event": "eval", "stage": "validation", "auroc": auroc},
                {"event": "summary", "train_seconds": seconds},
            ],
        )
    _log(
        str(tmp_path / "scratch" / days[4] / "train.jsonl"),
        [{"event": "eval", "stage": "validation", "auroc": 0.9}, {"event": "summary", "train_seconds": 40.0}],
    )

    assert daily_loop.main(["--summarize", "--work_dir", str(tmp_path)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["day"] for r in result["per_day"]] == days[1:4]
    assert result["rows_per_day"] == 40 and result["days"] == 6
    assert result["warm_wins"] == 2 and result["compared_days"] == 3  # day 3: 0.65 < 0.66
    assert result["worst_day"] == days[3] and abs(result["worst_margin"] + 0.01) < 1e-9
    assert result["warm_train_seconds"] == 6.0 and result["scratch_train_seconds"] == 60.0
    assert result["time_ratio"] == 0.1 and result["time_goal_met"] and not result["auroc_goal_met"]
    assert result["loop_wall_seconds"] is None and result["delta_ratio_max"] is None and result["parallel"] is None


def test_summarize_without_a_lake_is_one_line(tmp_path, capsys):
    assert daily_loop.main(["--summarize", "--work_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"--summarize: {tmp_path}/lake holds no lake of at least 4 days"], err
