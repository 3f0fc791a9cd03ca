"""Command-line options generated from the settings models, and where each value came from.

Every setting is a flag named after it (``limits.max_batch`` is ``--limits-max-batch``;
``--postgres``, ``--kafka`` and ``--schema`` are kept as short forms of ``--postgres-dsn``,
``--kafka-bootstrap`` and ``--postgres-schema``). The order of precedence is
:mod:`consumerkit.settings.precedence`'s.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import ValidationError
from pydantic_settings import SettingsError

from ..errors import ConfigurationError
from ..settings import ALIASES, PREFIX, CommonSettings, env_name, flag, precedence, settings_fields


def add_settings_arguments(parser: argparse.ArgumentParser, model: type[CommonSettings],
                           *, only: set[str] | None = None) -> None:
    """One flag per setting of ``model`` (or of ``only``); absent flags stay out of the
    namespace, so the variables and defaults apply."""
    group = parser.add_argument_group(
        "settings", "each also read from its variable or from .env (flag > variable > .env > "
        "default; see docs/configuration.md)")
    for name, field in settings_fields(model):
        if only is not None and name not in only:
            continue
        if get_origin(field.annotation) is dict and name != "webhook_headers":
            continue  # a mapping of client options: its variable alone (JSON)
        default = "unset" if field.default is None else (
            "none" if field.default_factory is not None or field.default == () else
            field.default)
        help_ = f"{field.description} (default: {default}; ${env_name(name)})"
        help_ = help_.replace("%", "%%")
        flags = [flag(name), *ALIASES.get(name, ())]
        if name == "webhook_headers":
            group.add_argument(*flags, dest=name, action="append", default=argparse.SUPPRESS,
                               metavar="'NAME: VALUE'", help=help_)
        elif name in REPEATED:
            group.add_argument(*flags, dest=name, action="append", default=argparse.SUPPRESS,
                               metavar=REPEATED[name], help=help_ + " (repeat for several)")
        elif field.annotation is bool:
            group.add_argument(*flags, dest=name, action=argparse.BooleanOptionalAction,
                               default=argparse.SUPPRESS, help=help_)
        else:
            choices = _choices(field.annotation)
            upper = bool(choices) and all(c == c.upper() for c in choices or [])
            group.add_argument(*flags, dest=name, default=argparse.SUPPRESS,
                               choices=choices, type=str.upper if upper else str,
                               metavar=None if choices else name.split(".")[-1].upper(),
                               help=help_)
    # a Path default: argparse checks only what is given, and a missing .env is no error
    parser.add_argument("--env-file", type=env_file, default=Path(".env"), metavar="FILE",
                        help="read settings from this file too (one that is given must exist)")


REPEATED = {"webhook_secrets": "whsec_...", "unhandled.ignore": "PATTERN"}
"""Settings given as one flag per item."""


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
    """The settings given as flags, by name (``limits.max_batch``)."""
    names = {name for name, _ in settings_fields(model)}
    given = {k: v for k, v in vars(args).items() if k in names}
    if "webhook_headers" in given:
        given["webhook_headers"] = dict(_header(h) for h in given["webhook_headers"])
    return given


def nested(flags: dict[str, Any]) -> dict[str, Any]:
    """Flags as the settings model's arguments: a group's fields in a mapping of its own."""
    found: dict[str, Any] = {}
    for name, value in flags.items():
        group, dot, field = name.partition(".")
        if dot:
            found.setdefault(group, {})[field] = value
        else:
            found[name] = value
    return found


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
        return model(_env_file=args.env_file, **nested(flags_given(args, model)))
    except SettingsError as exc:  # a variable that should hold JSON does not
        field = str(exc).split('"')[1] if '"' in str(exc) else "?"
        raise ConfigurationError(f"invalid setting ${env_name(field)}: not valid JSON "
                                 "(or not the expected form)") from None
    except ValidationError as exc:
        error = exc.errors()[0]
        names = {name for name, _ in settings_fields(model)}
        loc = [str(p) for p in error["loc"]]
        name = ".".join(loc[:2]) if ".".join(loc[:2]) in names else loc[0] if loc else "?"
        if name not in names:  # the variable's name when it came from there
            name = name.removeprefix(PREFIX).lower()
        where = f"{flag(name)} / ${env_name(name)}" if name in names else name
        message = error["msg"].removeprefix("Value error, ")  # a validator's own words
        raise ConfigurationError(f"invalid setting {where}: {message}") from None


def sources(args: argparse.Namespace, model: type[CommonSettings]) -> dict[str, str]:
    """Where each setting's value came from: ``flag``, ``env``, ``.env`` or ``default``."""
    return precedence.sources(model, flags_given(args, model), Path(args.env_file))
