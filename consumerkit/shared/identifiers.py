"""SQL identifiers and names: validate, quote (DSNs are redacted by :mod:`.dsn`).

asyncpg cannot bind identifiers, so every schema or table name that reaches string-built SQL
passes through :func:`identifier` first.
"""

from __future__ import annotations

import re

from ..errors import ConfigurationError
from .dsn import redact_dsn

__all__ = ["check_name", "identifier", "qualified", "redact_dsn"]

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
