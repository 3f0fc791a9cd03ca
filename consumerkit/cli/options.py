"""Command-line options generated from the settings models, and where each value came from.

Every field of a settings model is a flag (``postgres_dsn`` is ``--postgres``,
``kafka_bootstrap`` ``--kafka``, ``db_schema`` ``--schema``, the rest ``--field-name``). A
flag given on the command line wins over the variable, which wins over ``.env``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from dotenv import dotenv_values
from pydantic import SecretStr, ValidationError

from ..errors import ConfigurationError
from ..settings import CommonSettings, env_name, flag


def add_settings_arguments(parser: argparse.ArgumentParser, model: type[CommonSettings],
                           *, only: set[str] | None = None) -> None:
    """One flag per field of ``model`` (or of ``only``); absent flags stay out of the
    namespace, so the variables and defaults apply."""
    group = parser.add_argument_group(
        "settings", "each also read from its variable or from .env (flag > variable > .env > "
        "default; see docs/configuration.md)")
    for name, field in model.model_fields.items():
        if only is not None and name not in only:
            continue
        default = "unset" if field.default is None else (
            "none" if field.default_factory is not None else field.default)
        help_ = f"{field.description} (default: {default}; ${env_name(name)})"
        help_ = help_.replace("%", "%%")
        if name == "webhook_headers":
            group.add_argument(flag(name), dest=name, action="append", default=argparse.SUPPRESS,
                               metavar="'NAME: VALUE'", help=help_)
        elif name == "webhook_secrets":
            group.add_argument(flag(name), dest=name, action="append", default=argparse.SUPPRESS,
                               metavar="whsec_...", help=help_ + " (repeat for several)")
        elif name == "ignore":
            group.add_argument(flag(name), dest=name, action="append", default=argparse.SUPPRESS,
                               metavar="PATTERN", help=help_ + " (repeat for several)")
        elif field.annotation is bool:
            group.add_argument(flag(name), dest=name, action=argparse.BooleanOptionalAction,
                               default=argparse.SUPPRESS, help=help_)
        else:
            choices = _choices(field.annotation)
            upper = bool(choices) and all(c == c.upper() for c in choices or [])
            group.add_argument(flag(name), dest=name, default=argparse.SUPPRESS,
                               choices=choices, type=str.upper if upper else str,
                               metavar=None if choices else name.upper(), help=help_)
    # a Path default: argparse checks only what is given, and a missing .env is no error
    parser.add_argument("--env-file", type=env_file, default=Path(".env"), metavar="FILE",
                        help="read settings from this file too (one that is given must exist)")


def env_file(text: str) -> Path:
    """An ``--env-file`` that exists: a missing one would be ignored without a word."""
    path = Path(text)
    if not path.is_file():
        reason = "is a directory" if path.is_dir() else "no such file"
        raise argparse.ArgumentTypeError(f"{reason}: {text!r}")
    return path


def _choices(annotation: Any) -> list[str] | None:
    """The values of a ``Literal`` (or optional ``Literal``) field."""
    if get_origin(annotation) is Literal:
        return [str(a) for a in get_args(annotation)]
    for arg in get_args(annotation):
        if get_origin(arg) is Literal:
            return [str(a) for a in get_args(arg)]
    return None


def flags_given(args: argparse.Namespace, model: type[CommonSettings]) -> dict[str, Any]:
    """The settings fields given as flags."""
    given = {k: v for k, v in vars(args).items() if k in model.model_fields}
    if "webhook_headers" in given:
        given["webhook_headers"] = dict(_header(h) for h in given["webhook_headers"])
    return given


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise ConfigurationError(f"--webhook-header {name.strip()!r}...: write 'Name: value'")
    return name.strip(), value.strip()


def load_settings(args: argparse.Namespace, model: type[CommonSettings]) -> CommonSettings:
    """The settings from flags, variables, ``--env-file`` and defaults; a value that does not
    validate is a one-line :class:`ConfigurationError` naming its flag and variable (never
    the value: it may be a secret)."""
    try:
        return model(_env_file=args.env_file, **flags_given(args, model))
    except ValidationError as exc:
        error = exc.errors()[0]
        name = next((str(p) for p in error["loc"] if str(p) in model.model_fields), None)
        if name is None:  # the variable's name when it came from there
            name = str(error["loc"][0]).removeprefix("CONSUMERKIT_").lower()
            name = "db_schema" if name == "schema" else name
        where = f"{flag(name)} / ${env_name(name)}" if name in model.model_fields else name
        raise ConfigurationError(f"invalid setting {where}: {error['msg']}") from None


def sources(args: argparse.Namespace, model: type[CommonSettings]) -> dict[str, str]:
    """Where each field's value came from: ``flag``, ``env``, ``.env`` or ``default``."""
    given = flags_given(args, model)
    environ = {k.upper() for k in os.environ}
    path = Path(args.env_file)
    dotenv = {k.upper() for k in dotenv_values(path)} if path.is_file() else set()
    found = {}
    for name in model.model_fields:
        variable = env_name(name)
        found[name] = ("flag" if name in given else "env" if variable in environ
                       else str(args.env_file) if variable in dotenv else "default")
    return found


def shown(value: object) -> str:
    """A value as ``config`` prints it: secrets as ``**********``."""
    if isinstance(value, SecretStr):
        return str(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {shown(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    return "unset" if value is None else str(value)
