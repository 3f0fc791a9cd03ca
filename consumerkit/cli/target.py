"""``MODULE:ATTR``, as ``uvicorn app:app`` reads it: import a module, take an attribute, and
call it (sync or async, no arguments) when it is a function returning the consumer."""

from __future__ import annotations

import importlib
import inspect
import os
import sys

from ..consumer import Consumer
from ..errors import ConsumerKitError
from .errors import CommandError


async def load_consumer(target: str) -> Consumer:
    """The :class:`Consumer` ``target`` names; a one-line :class:`CommandError` otherwise."""
    value = await load_target(target, Consumer)
    if not isinstance(value, Consumer):
        raise CommandError(f"{target} is a {type(value).__name__}, not a Consumer nor a "
                           "function returning one")
    return value


async def load_target(target: str, *kinds: type) -> object:
    """The object ``target`` names, called when it is a function and not one of ``kinds``;
    a one-line :class:`CommandError` when it cannot be loaded."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise CommandError(f"{target!r}: write MODULE:ATTR, e.g. billing.app:consumer")
    if os.getcwd() not in sys.path:  # like uvicorn: the current directory is importable
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise CommandError(
                f"cannot import module {module_name!r} (no module named {exc.name!r}): run "
                "from the directory that holds it, or add that directory to PYTHONPATH"
            ) from None
        raise CommandError(f"importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:
        raise CommandError(f"importing {module_name!r} failed: {type(exc).__name__}: {exc} "
                           "(--debug shows the traceback)") from exc
    value: object = module
    for part in attr.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise CommandError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(value, kinds) and callable(value):
        try:
            value = value()
            if inspect.isawaitable(value):
                value = await value
        except ConsumerKitError:
            raise
        except Exception as exc:
            raise CommandError(f"{target}() failed: {type(exc).__name__}: {exc} (--debug "
                               "shows the traceback)") from exc
    return value
