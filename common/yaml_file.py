"""Reading a YAML file a user hands in: safely (``yaml.safe_load`` never runs code),
with one-line errors that say where."""

from typing import Any

import yaml


def load_yaml(path: str, error: type[Exception]) -> Any:
    """The document in ``path``; raises ``error`` with one line naming the file (and
    the line and column of a syntax error).

    Example::

        document = load_yaml("sweep.yaml", SweepError)
    """
    try:
        with open(path) as f:
            return yaml.safe_load(f)
    except OSError as e:
        raise error(f"{path}: cannot read ({e.strerror})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}:" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise error(f"{path}:{where} malformed YAML: {problem}") from None
