"""SQL identifiers and secrets: validate, quote, redact.

asyncpg cannot bind identifiers, so every schema or table name that reaches string-built SQL
passes through :func:`identifier` first.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit, urlunsplit

from ..errors import ConfigurationError

_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def identifier(value: str, what: str = "identifier") -> str:
    """Return ``value`` double-quoted after checking it is a plain lower-case SQL identifier."""
    if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value):
        raise ConfigurationError(
            f"invalid {what} {value!r}: use 1-63 characters of a-z, 0-9 and _, "
            "starting with a letter or _"
        )
    return f'"{value}"'


def qualified(schema: str, name: str) -> str:
    """``"schema"."name"`` with both parts validated."""
    return f"{identifier(schema, 'schema name')}.{identifier(name, 'table name')}"


def check_name(value: str, what: str) -> str:
    """Validate a consumer, topic or namespace name (Kafka-style characters, at most 200)."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise ConfigurationError(
            f"invalid {what} {value!r}: use 1-200 characters of letters, digits, '.', '_' "
            "and '-', starting with a letter or digit"
        )
    return value


_URL = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.-]*://")
_KEYWORD_PASSWORD = re.compile(
    r"""(\w*password\s*=\s*)   # password=, sslpassword=, any case, spaces around '='
        ('(?:\\.?|[^'\\])*'?     # a quoted value (backslash escapes; unterminated: to the end)
        |(?:\\.?|[^\s\\])*)     # or an unquoted one, up to unescaped white space
    """,
    re.IGNORECASE | re.VERBOSE | re.DOTALL,
)


def redact_dsn(dsn: str) -> str:
    """A DSN with every password replaced by ``***`` (for logs and error messages).

    Both libpq forms are covered: a URL (the password of the user info, and ``password=`` or
    ``sslpassword=`` in the query, percent-encoded keys included since libpq decodes them) and
    ``key=value`` pairs (quoted or not, with libpq's backslash escapes). Any key ending in
    ``password`` counts, whatever its case: redacting too much is harmless, too little is not.
    """
    if not _URL.match(dsn):
        return _KEYWORD_PASSWORD.sub(r"\1***", dsn)
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return "<unparseable dsn>"
    query = "&".join(_redact_pair(pair) for pair in parts.query.split("&")) if parts.query else ""
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:***@{host}" if ":" in userinfo else f"{user}@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _redact_pair(pair: str) -> str:
    key, sep, _value = pair.partition("=")
    if sep and unquote(key).strip().lower().endswith("password"):
        return f"{key}=***"
    return pair
