"""Typed reading of the project's own JSON files, each problem one line naming the file and the field.

A file written by one of our dataclasses (a checkpoint's ``meta.json``, an export's
``inputs.json``) is read back through `JsonObject`: every field is checked as it is
taken, and a missing, malformed or newer-version field is a `FileFieldError`
(`common.errors.BadInput`) whose message says which file and which field.

Example::

    document, version = JsonObject.versioned(data, "model/inputs.json", "an exported model's inputs", current=2)
    step = document.get("step", INTEGER)
    sizes = document.get("num_embeddings_per_feature", int_list(26, minimum=1))
"""

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NoReturn

from common.errors import BadInput
from common.url_paths import redacted_record


class FileFieldError(BadInput):
    """A JSON file of ours is unreadable, or a field of it is missing, malformed or too new."""


@dataclass(frozen=True)
class Kind:
    """What a field must hold: a test of the JSON value and the words for the error."""

    accepts: Callable[[Any], bool]
    expected: str


def _is_int(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def integer(minimum: int = 0) -> Kind:
    """An integer (not a bool) of at least ``minimum``."""
    words = {0: "a count", 1: "a positive integer"}.get(minimum, f"an integer of at least {minimum}")
    return Kind(lambda v: _is_int(v, minimum), words)


def int_list(length: int | None = None, minimum: int = 0) -> Kind:
    """A list of integers (``length`` of them when given), each at least ``minimum``."""
    words = "positive integers" if minimum == 1 else "integers" if minimum <= 0 else f"integers >= {minimum}"
    return Kind(
        lambda v: isinstance(v, list) and (length is None or len(v) == length) and all(_is_int(i, minimum) for i in v),
        f"{length} {words}" if length is not None else f"a list of {words}",
    )


def text_list(length: int | None = None, allow_empty: bool = False) -> Kind:
    """A list of strings (``length`` of them when given), non-empty unless ``allow_empty``."""
    return Kind(
        lambda v: (
            isinstance(v, list)
            and (allow_empty or bool(v))
            and (length is None or len(v) == length)
            and all(isinstance(s, str) for s in v)
        ),
        f"{length} names" if length is not None else "a list of names" if allow_empty else "a non-empty list of names",
    )


def one_of(*choices: str) -> Kind:
    return Kind(lambda v: v in choices, " or ".join(choices))


def optional(kind: Kind) -> Kind:
    """``kind`` or null."""
    return Kind(lambda v: v is None or kind.accepts(v), f"{kind.expected} or null")


INTEGER = integer(0)
TEXT = Kind(lambda v: isinstance(v, str), "a string")
NUMBER = Kind(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number")
BOOLEAN = Kind(lambda v: isinstance(v, bool), "true or false")
COUNTS = Kind(lambda v: isinstance(v, dict) and all(_is_int(n, 0) for n in v.values()), "an object of counts")
OBJECT = Kind(lambda v: isinstance(v, dict), "an object")


def feature_keys_error(facts: dict[str, Any], field: str, names: Sequence[str], what: str) -> str | None:
    """The error, or None, for ``facts[field]``: an object keyed by exactly the model's
    feature ``names`` (an id map's or a vocabulary's per-feature facts; ``what``: the
    file's field, as ``zch_ids``)."""
    values = facts.get(field)
    if isinstance(values, dict) and sorted(values) == sorted(names):
        return None
    have = ",".join(values) if isinstance(values, dict) else "none"
    return f"{what}.{field} is of features {have}, not the model's {','.join(names)}: another model's"


# The digest every file we write is named by (checkpoints, exports, id maps, vocabularies).
SHA256 = Kind(
    lambda v: isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v),
    "a SHA-256 in hex",
)


def _is_share(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0


SHARE = Kind(_is_share, "a share between 0 and 1")
SHARES = Kind(
    lambda v: isinstance(v, dict) and all(_is_share(s) for s in v.values()), "an object of shares between 0 and 1"
)
REQUIRED = object()  # `JsonObject.get` default of a field that must be there


class JsonObject:
    """One JSON object of a file (the whole document, or an object inside it).

    Args:
        value: the parsed JSON value.
        path: the file, for errors.
        where: the dotted field path of ``value`` in the document ("" for the document).
        what: what the file should be, for the error when it is not JSON or not an object.
    """

    def __init__(self, value: Any, path: str, where: str = "", what: str = "the expected JSON object") -> None:
        self.path, self.where, self.what = path, where, what
        if not isinstance(value, dict):
            if where:
                self._fail(where, OBJECT.expected, value)
            raise FileFieldError(f"{path}: the content must be a JSON object, got {self._short(value)} (not {what})")
        self.value: dict[str, Any] = value

    @classmethod
    def parse(cls, data: bytes, path: str, what: str) -> "JsonObject":
        """The document of a file's bytes; FileFieldError (naming the file) unless it is a JSON object."""
        try:
            document = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise FileFieldError(f"{path}: not {what} ({e})") from e
        return cls(document, path, what=what)

    @staticmethod
    def _short(value: Any) -> str:
        text = json.dumps(value)
        return text if len(text) <= 60 else text[:57] + "..."

    def _name(self, field: str) -> str:
        return f"{self.where}.{field}" if self.where else field

    def _fail(self, name: str, expected: str, value: Any) -> NoReturn:
        raise FileFieldError(f"{self.path}: {name} must be {expected}, got {self._short(value)}")

    def has(self, field: str) -> bool:
        return field in self.value

    def get(self, field: str, kind: Kind, default: Any = REQUIRED) -> Any:
        """The field's value, checked against ``kind``; ``default`` when absent (required without one)."""
        if field not in self.value:
            if default is REQUIRED:
                raise FileFieldError(f"{self.path}: {self._name(field)} is missing")
            return default
        value = self.value[field]
        if not kind.accepts(value):
            self._fail(self._name(field), kind.expected, value)
        return value

    def object(self, field: str, default: Any = REQUIRED) -> "JsonObject":
        """A nested object field as a JsonObject (``default``: a value to read when absent)."""
        value = self.value.get(field, default) if default is not REQUIRED else self.get(field, OBJECT)
        return JsonObject(value, self.path, self._name(field), self.what)

    def objects(self, field: str) -> dict[str, "JsonObject"]:
        """An object of objects (``{"fp32": {...}, ...}``), each as a JsonObject."""
        return {
            key: JsonObject(value, self.path, f"{self._name(field)}.{key}", self.what)
            for key, value in self.get(field, OBJECT).items()
        }

    @classmethod
    def versioned(cls, data: bytes, path: str, what: str, current: int) -> tuple["JsonObject", int]:
        """The document of a file written by `versioned_json` and its version (files
        of version 1 named it ``format_version``); refused when newer than ``current``."""
        document = cls.parse(data, path, what)
        return document, document.version(current, legacy_key="format_version")

    def version(self, current: int, legacy_key: str | None = None) -> int:
        """The document's format version (under ``legacy_key`` in older files); refused
        when it is not a positive integer or is newer than ``current``."""
        key = "version" if self.has("version") or legacy_key is None else legacy_key
        version: int = self.get(key, integer(1))
        if version > current:
            raise FileFieldError(
                f"{self.path}: {key} is {version}, newer than this code reads ({current}): "
                "use the release that wrote it or a newer one"
            )
        return version


def versioned_json(record: Any, **leading: Any) -> bytes:
    """A dataclass with a ``version`` field as indented JSON: the version first, then
    ``leading`` (derived values written for readers), then the fields; a URL's
    credentials in any string masked (common/url_paths.py: these files travel with models)."""
    document = redacted_record(asdict(record))
    return json.dumps({"version": document.pop("version"), **leading, **document}, indent=1).encode()
