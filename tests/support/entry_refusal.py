"""The training entry point refusing its flags in this process: exit 2, one error line."""

import dlrm_main


def refusal_line(capsys, argv: list[str]) -> str:
    """Runs ``dlrm_main.main(argv)``: it must exit 2 with no traceback and exactly one line
    that mentions an error, of the form ``PROG: error: WHY``; returns WHY."""
    try:
        code = dlrm_main.main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if "error" in line]
    assert len(lines) == 1 and ": error: " in lines[0], err[-3000:]
    return lines[0].split(": error: ", 1)[1]
