"""What a group given a bad value says: pydantic's :class:`~pydantic.ValidationError` as one
:class:`~consumerkit.errors.ConfigurationError` line, ``Limits.max_batch must be at least 1,
not 0``, so that a caller catches the project's own error and never sees a secret.

The value refused is shown only when it is short and its field holds no secret (a DSN, a
password): ``Postgres.dsn must be a valid string`` says what is wrong without printing it.
"""

from __future__ import annotations

from typing import Any

from pydantic import SecretStr, ValidationError
from pydantic_core import ErrorDetails

from ..errors import ConfigurationError

_SHOWN_MAX = 40
"""The longest value repeated in a message (a longer one is elided: a line stays a line)."""

_BOUNDS = {"greater_than_equal": ("ge", "at least"), "greater_than": ("gt", "greater than"),
           "less_than_equal": ("le", "at most"), "less_than": ("lt", "less than")}


def invalid(group: type[Any], exc: ValidationError) -> ConfigurationError:
    """The one-line error for ``exc``, raised while validating ``group``: its first problem,
    and how many more there are."""
    errors = exc.errors(include_url=False)
    first = _line(group, errors[0])
    more = len(errors) - 1
    return ConfigurationError(first + (f" (and {more} more)" if more else ""))


def _line(group: type[Any], error: ErrorDetails) -> str:
    loc = [str(part) for part in error["loc"]]
    field = loc[0] if loc else ""
    name = ".".join([group.__name__, *loc])
    if error["type"] == "extra_forbidden":
        known = ", ".join(group.model_fields)
        return f"{group.__name__} has no field {field!r} (its fields: {known})"
    if error["type"] == "value_error":  # a validator's own words, which name the value
        return f"{name}: {_one_line(error['msg'].removeprefix('Value error, '))}"
    what = _one_line(_what(error))
    if _secret(group, field):
        return f"{name} {what}"
    return f"{name} {what}, not {_shown(error['input'])}"


def _what(error: ErrorDetails) -> str:
    """What the value should be, in the words ``must be at least 1``."""
    bound = _BOUNDS.get(error["type"])
    if bound is not None:
        key, words = bound
        return f"must be {words} {(error.get('ctx') or {}).get(key)}"
    return error["msg"].replace("Input should be", "must be", 1)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _secret(group: type[Any], field: str) -> bool:
    """Whether ``field`` of ``group`` may hold a secret: its value is never shown, even
    refused. A :class:`SecretStr` anywhere in its type does, and so may a mapping of client
    options passed on as they are (``Kafka(options={"sasl_plain_password": ...})``)."""
    info = group.model_fields.get(field)
    if info is None:  # the group as a whole, or no field of it
        return True
    kind = repr(info.annotation)
    return info.annotation is SecretStr or "SecretStr" in kind or kind.startswith("dict[")


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_MAX else text[:_SHOWN_MAX - 3] + "..."


__all__ = ["invalid"]
