"""Which value of each setting wins, decided here alone.

Highest first: a field the code chose (given to its group: ``Limits(max_batch=100)``), a
flag, a variable, the ``.env`` file, the default. pydantic-settings merges the flags (passed
as the model's arguments), the variables and ``.env`` in that order; :func:`sources` says
which of them gave each setting, and :func:`resolve` lays the code's choices over them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from dotenv import dotenv_values
from pydantic import SecretStr

from ..shared.dsn import redact_dsn
from . import CommonSettings, ConsumerSettings, env_name, flag, settings_fields, value
from .groups import Group

log = logging.getLogger("consumerkit.cli")  # warns as the command that reads them


def sources(model: type[CommonSettings], flags: Collection[str],
            env_file: Path) -> dict[str, str]:
    """Where each setting of ``model`` came from: ``flag`` (one of ``flags``, the settings
    given on the command line), ``env``, the ``.env`` file's name, or ``default``."""
    environ = {k.upper() for k in os.environ}
    dotenv = {k.upper() for k in dotenv_values(env_file)} if env_file.is_file() else set()
    found = {}
    for name, _ in settings_fields(model):
        variable = env_name(name)
        group = variable.rsplit("_", 1)[0] if "." in name else None
        # a group may also come whole, as JSON in its own variable (CONSUMERKIT_LIMITS)
        found[name] = ("flag" if name in flags
                       else "env" if variable in environ or group in environ
                       else str(env_file) if variable in dotenv else "default")
    return found


def resolve(code: Mapping[str, Any], settings: ConsumerSettings,
            origin: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The effective options of a consumer whose code gave ``code`` (its groups and
    ``offset_store``, :meth:`Consumer.options`), and the source of each setting: ``code``
    where the code chose it, else ``origin``'s. A setting given for a value the code chose,
    with another value, is ignored with a warning."""
    options: dict[str, Any] = {}
    found = dict(origin)
    for name, ours in code.items():
        if isinstance(ours, Group):
            chosen = ours.chosen()
            values = {}
            for field in type(ours).model_fields:
                key = f"{name}.{field}"
                if field in chosen:
                    values[field] = getattr(ours, field)
                    _chosen(key, getattr(ours, field), settings, found)
                else:
                    values[field] = value(settings, key)
            options[name] = type(ours).model_construct(set(chosen), **values)
        elif ours is not None:
            options[name] = ours
            _chosen(name, ours, settings, found)
        else:
            options[name] = value(settings, name)
    return options, found


def _chosen(name: str, ours: object, settings: ConsumerSettings,
            found: dict[str, str]) -> None:
    if found[name] != "default" and value(settings, name) != ours:
        log.warning("%s (%s) ignored: the consumer's code gives %s=%s", flag(name),
                    found[name], name, shown(ours, dsn=name == "postgres.dsn"))
    found[name] = "code"


def shown(value: object, *, dsn: bool = False) -> str:
    """A value as output shows it: secrets as ``**********``, a DSN without its password."""
    if dsn and isinstance(value, SecretStr):
        return redact_dsn(value.get_secret_value())
    if isinstance(value, SecretStr):
        return str(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {shown(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    return "unset" if value is None else str(value)
