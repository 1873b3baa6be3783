"""scripts/commit_msg.py, the commit-msg hook: a subject of at most 72 characters, a
blank line, a body."""

import pytest

from scripts.commit_msg import MAX_SUBJECT, main, problems

BODY = "\n\nWhy: the next reader needs the reason.\n"


def test_a_short_subject_with_a_body_passes():
    assert problems("x" * MAX_SUBJECT + BODY) == []


def test_a_long_subject_is_refused_with_its_length():
    assert problems("x" * (MAX_SUBJECT + 1) + BODY) == [
        "the subject is 73 characters, at most 72: say the change in short, the details go in the body"
    ]


def test_the_body_is_required_after_a_blank_line():
    assert problems("Subject only\n") == ["no body: after a blank line, say why the change is made"]
    assert problems("Subject\nbody at once\n") == [
        "the subject is followed by a second line: leave a blank line before the body"
    ]


@pytest.mark.parametrize("subject", ["Merge branch 'h-checks'", "fixup! ruff configured", 'Revert "x"'])
def test_commits_git_writes_or_folds_need_no_body(subject):
    assert problems(subject + "\n") == []


def test_what_git_strips_is_not_the_message():
    """Comment lines and a verbose commit's diff below the scissors line: the long line
    there is no subject, and a message of comments only is empty."""
    scissors = "# ------------------------ >8 ------------------------\n"
    assert problems("\n# Please enter the commit message\nSubject" + BODY + scissors + "y" * 200 + "\n") == []
    assert problems("# Please enter the commit message\n\n") == ["the message is empty"]


def test_main_reads_the_message_file_and_exits_1_on_a_problem(tmp_path, capsys):
    message = tmp_path / "COMMIT_EDITMSG"
    message.write_text("x" * 100 + BODY)
    assert main([str(message)]) == 1
    assert capsys.readouterr().err == (
        "commit_msg: the subject is 100 characters, at most 72: say the change in short, the details go in the body\n"
    )
    message.write_text("Short" + BODY)
    assert main([str(message)]) == 0
    assert main([str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err == (
        f"commit_msg: error: {tmp_path / 'missing'}: cannot read the message: No such file or directory\n"
    )
