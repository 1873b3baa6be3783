"""Every command-line tool a user runs answers --help with a meaning for each of its flags."""

import contextlib
import importlib
import io

import pytest

# (module whose main(argv) is the tool, the subcommand's arguments before --help)
CLIS = [
    ("dlrm_main", []), ("dcnv2_main", []),
    ("data.preprocess_criteo", []), ("data.synthetic_criteo", []), ("data.synthetic_csv", []),
    ("data.synthetic_parquet", []),
    ("data.transcode", []), ("data.criteo_feature_spec", []),
    ("serving.export", []), ("serving.predict", []), ("serving.quality_gate", []), ("serving.serve", []),
    ("training.report", []), ("sharding_plans.cli", []), ("sharding_plans.cli", ["plan"]),
    ("sweeps.cli", []), ("sweeps.cli", ["run"]), ("scripts.check_install", []), ("training.baseline", []),
    ("scripts.wheelhouse", ["build"]), ("scripts.trim_fbgemm_wheel", []),
]


def options_without_help(help_text: str) -> list[str]:
    """The options of an argparse --help whose line has no text after them and whose next
    line is no continuation (argparse indents help text well past the options' 2 spaces)."""
    lines = help_text.splitlines()
    missing = []
    for i, line in enumerate(lines):
        if not line.startswith("  -"):
            continue
        spec, _, rest = line.strip().partition("  ")
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if not rest.strip() and not following.startswith(" " * 6):
            missing.append(spec)
    return missing


def test_options_without_help_finds_them():
    text = "options:\n  -h, --help  show this\n  --seed SEED\n  --rows ROWS\n                        rows per day\n"
    assert options_without_help(text) == ["--seed SEED"]


@pytest.mark.parametrize("module, sub", CLIS, ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_every_flag_has_help(module, sub):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        importlib.import_module(module).main([*sub, "--help"])
    assert done.value.code == 0 and "usage:" in out.getvalue()
    assert options_without_help(out.getvalue()) == []
