"""bench/peer_throughput.py without the public example (CI has no checkout of it): the
rate arithmetic, the ratio and the argument checks, in-process."""

import os

import pytest

from bench.peer_throughput import TimedRun, main, median_ratio, records_per_sec


def test_rate_is_the_extra_records_over_the_extra_seconds():
    # 100 extra steps of 2 ranks x 1024 rows in 10 extra seconds; start-up (20 s) cancels.
    short, long = TimedRun(30, 20.0, 1.5, 1.7), TimedRun(130, 30.0, 1.7, 1.9)
    assert records_per_sec(short, long, records_per_step=2048) == pytest.approx(20480.0)
    assert median_ratio([30.0, 10.0, 20.0], [8.0, 12.0, 10.0]) == pytest.approx(2.0)


def test_a_long_run_no_slower_than_the_short_one_is_an_error_not_a_rate():
    with pytest.raises(RuntimeError, match="130-step run took 19.0 s, no longer than the 30-step run's 20.0 s"):
        records_per_sec(TimedRun(30, 20.0, 0, 0), TimedRun(130, 19.0, 0, 0), 2048)
    with pytest.raises(ValueError, match="must have more steps"):
        records_per_sec(TimedRun(30, 20.0, 0, 0), TimedRun(30, 25.0, 0, 0), 2048)


def test_a_missing_peer_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "dlrm_main.py").write_text("")  # the entry point alone: the loader is missing
    assert main(["--peer", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(
        f"python bench/peer_throughput.py: error: --peer {tmp_path}: not a checkout of the public "
        f"example's torchrec_dlrm folder (no {os.path.join('data', 'dlrm_dataloader.py')})"
    )


def exit_code(argv):
    """main's exit code, whether a bad flag exits from the parser or bad input returns 2."""
    try:
        return main(argv)
    except SystemExit as exit:
        return exit.code


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--short_steps", "30", "--long_steps", "30"], "--long_steps (30) must be above --short_steps (30)"),
        (["--rounds", "0"], "argument --rounds: must be positive, got 0"),
    ],
)
def test_step_and_round_counts_are_checked_before_anything_runs(tmp_path, capsys, argv, message):
    # The peer is missing too: the counts are checked first, before the peer and any run.
    assert exit_code(["--peer", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
