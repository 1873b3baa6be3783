"""URLs the project accepts as paths (``--parquet_path s3://...``), and how they are shown.

A URL's user-info (``s3://KEY:SECRET@bucket``) and query (``?secret_key=...``) are
where pyarrow and fsspec take credentials from. Whatever a run is given ends up in its
start-up block, its JSON log, its checkpoints' meta.json, sweep results and error
lines, so credentials in a path are refused (`check_url_path`): they belong in the
environment (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``,
``AWS_PROFILE``, ``GOOGLE_APPLICATION_CREDENTIALS``), which the project never writes
anywhere. A query keeps only the options in `ALLOWED_QUERY`, pyarrow's non-secret
filesystem options.

Everything that shows or writes a path goes through `redacted` (a line of text:
`redacted_text`; a record: `redacted_record`), so that a path from any other route
still never shows a secret:

    redacted("s3://AKIA:wJalr@clicks/log?region=eu-west-1&secret_key=x")
    # 's3://***@clicks/log?region=eu-west-1&secret_key=***'
"""

import re
import urllib.parse
from typing import Any

from common.errors import BadInput

MASK = "***"

# Query options pyarrow's S3, GCS and HDFS filesystems take from a URL that hold no
# secret (pyarrow refuses any other; access_key, secret_key, session_token and
# kerb_ticket are the ones that would be credentials).
ALLOWED_QUERY = frozenset(
    {
        "region",
        "scheme",
        "endpoint_override",
        "allow_bucket_creation",
        "allow_bucket_deletion",
        "tls_ca_file_path",
        "retry_limit_seconds",
        "project_id",
        "replication",
        "buffer_size",
        "default_block_size",
        "user",
    }
)

# Where credentials go instead (shown in the refusal).
CREDENTIALS_HINT = (
    "give credentials in the environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY "
    "(AWS_SESSION_TOKEN) or a profile, AWS_PROFILE; GCS: GOOGLE_APPLICATION_CREDENTIALS "
    "(docs/data.md)"
)

# A URL inside free text: a scheme, "://", then up to whitespace or a quote, less the
# punctuation that ends a phrase ("--parquet_path s3://b/x: no such file").
_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>]*[^\s'\"<>.,;:)\]]")


def is_url(path: str) -> bool:
    return "://" in path


def _split(path: str) -> tuple[str, str, str, str, str]:
    """(scheme, user-info or "", the rest of the authority and path, query, fragment),
    split by hand: urllib would parse a glob's ``[`` as an IPv6 host and fail, and cut
    user-info at a secret's unescaped ``/`` or ``#`` (AWS secret keys hold ``/``)."""
    scheme, rest = path.split("://", 1)
    userinfo, at, after = rest.rpartition("@")
    # User-info runs up to the last @ and has a colon before any / ? or # (KEY:SECRET),
    # or none of them (USER); else the @ is in the path or the query (bucket/a@b).
    first = re.search(r"[:/?#]", userinfo)
    if at and (first is None or first.group(0) == ":"):
        rest = after
    else:
        userinfo = ""
    rest, _, fragment = rest.partition("#")
    rest, _, query = rest.partition("?")
    return scheme, userinfo, rest, query, fragment


def redacted(path: str) -> str:
    """``path`` as it may be shown or written: a URL's user-info and the values of its
    query parameters outside `ALLOWED_QUERY` replaced by ``***``; anything else as is."""
    if not is_url(path):
        return path
    scheme, userinfo, rest, query, fragment = _split(path)
    shown = f"{scheme}://" + (f"{MASK}@" if userinfo else "") + rest
    if query:
        pairs = []
        for pair in query.split("&"):
            key, equals, value = pair.partition("=")
            known = urllib.parse.unquote_plus(key) in ALLOWED_QUERY
            pairs.append(key + equals + (value if known else MASK if equals else ""))
        shown += "?" + "&".join(pairs)
    return shown + (f"#{MASK}" if fragment else "")


def redacted_text(text: str) -> str:
    """``text`` with every URL in it `redacted` (an error line, a printed line)."""
    return _URL_IN_TEXT.sub(lambda match: redacted(match.group(0)), text) if "://" in text else text


def redacted_record(value: Any) -> Any:
    """A JSON value (a log record, a meta.json document) with every string in it
    `redacted_text` (a copy of its lists and dicts)."""
    if isinstance(value, str):
        return redacted_text(value)
    if isinstance(value, dict):
        return {key: redacted_record(item) for key, item in value.items()}
    if type(value) in (list, tuple):  # not a named tuple, which is built otherwise (and holds no path)
        return type(value)(redacted_record(item) for item in value)
    return value


def check_url_path(path: str, flag: str, error: type[Exception] = BadInput) -> None:
    """Refuses a URL that carries credentials: user-info, or a query parameter outside
    `ALLOWED_QUERY`; a plain path passes. ``flag`` names it; ``error`` is raised.

    Raises:
        error: ``"--parquet_path s3://***@b/log: credentials in a URL are refused ..."``
            (the URL `redacted`).
    """
    if not is_url(path):
        return
    _, userinfo, _, query, fragment = _split(path)
    if userinfo:
        raise error(
            f"{flag} {redacted(path)}: credentials in a URL (user-info before @) are refused, "
            f"as the URL is printed and recorded; {CREDENTIALS_HINT}"
        )
    unknown = sorted(
        {urllib.parse.unquote_plus(pair.partition("=")[0]) for pair in query.split("&") if pair} - ALLOWED_QUERY
    )
    if unknown:
        raise error(
            f"{flag} {redacted(path)}: query parameter {unknown[0]} is refused (a URL may carry only "
            f"non-secret options such as region, endpoint_override, scheme); {CREDENTIALS_HINT}"
        )
    if fragment:
        raise error(f"{flag} {redacted(path)}: a URL with a #fragment is refused (no filesystem reads one)")
