"""The project's release: pyproject.toml reads it from here (its one source), and every
CLI prints it for ``--version`` (common/cli.py). CHANGELOG.md's top entry names it."""

VERSION = "0.8.0"
