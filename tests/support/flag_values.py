"""Values for generated flag tests: one a flag does not have by default, and its text."""

import typing
from typing import Any

from common.config_flags import Flag


def other_value(item: Flag, default: Any) -> tuple[Any, list[str]]:
    """A value of the flag's type other than ``default``, and its command-line text."""
    if item.is_switch:
        return True, []
    if item.spec.choices is not None:
        value = next(c for c in reversed(item.spec.choices) if c != default)
    elif item.value_type == list[int]:
        value = [3, 5, 7]
    elif item.value_type == list[str]:  # a repeated flag: one item
        value = ["some/path"]
    elif item.value_type is int or int in typing.get_args(item.value_type):  # int | str: --num_embeddings
        value = (default or 0) + 7
    elif item.value_type is float:
        value = (default or 0.0) + 0.25
    else:
        value = "some/path"
    text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
    return value, [text]
