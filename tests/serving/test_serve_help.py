"""`--help` of the serving CLIs shows the defaults a user would otherwise guess."""

import pytest

from serving import serve


def test_serve_help_shows_defaults(capsys):
    with pytest.raises(SystemExit) as e:
        serve.main(["--help"])
    assert e.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for shown in (
        "address to listen on (default: 127.0.0.1)",
        "port to listen on (default: 8080)",
        "which exported model to serve (default: fp32)",
        "threads parsing request bodies (default: 2)",
        "on SIGTERM or SIGINT, seconds the requests in flight may take to finish (cancelled after) (default: 20.0)",
    ):
        assert shown in help_text
    assert "(default: None)" not in help_text  # --model is required, --num_threads says torch's
    assert help_text.count("(default:") == 10
