"""``MODULE:ATTR``, as ``uvicorn app:app`` reads it: import a module, take an attribute, and
call it (sync or async, no arguments) when it is a function returning the consumer."""

from __future__ import annotations

import importlib
import inspect
import os
import sys

from ..consumer import Consumer
from ..errors import ConsumerKitError
from ..registry import _ROUTE_ATTR, HandlerRegistry, RouteSpec
from .errors import CommandError

EXPECTED = ("point MODULE:ATTR at a Consumer, or at a function without arguments returning "
            "one (e.g. billing.app:consumer)")


async def load_consumer(target: str) -> Consumer:
    """The :class:`Consumer` ``target`` names; a one-line :class:`CommandError` otherwise."""
    value = await load_target(target, Consumer, expected=f"a Consumer: {EXPECTED}")
    if not isinstance(value, Consumer):
        raise CommandError(f"{target} is {_article(type(value).__name__)}, not a Consumer: "
                           f"{EXPECTED}")
    return value


async def load_target(target: str, *kinds: type, expected: str | None = None) -> object:
    """The object ``target`` names, called when it is a function and not one of ``kinds``;
    a one-line :class:`CommandError` when it cannot be loaded. With ``expected`` (what it
    should be), a callable that cannot be such a function (a handler, a registry, one that
    needs arguments) is refused in one line saying what it is."""
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
    found = None if expected is None or isinstance(value, kinds) else _not_a_factory(value)
    if found is not None:
        raise CommandError(f"{target} is {found}, not {expected}")
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
        if expected is not None and not isinstance(value, kinds):
            raise CommandError(f"{target}() returned {_article(type(value).__name__)}, not "
                               f"{expected}")
    return value


def _not_a_factory(value: object) -> str | None:
    """What ``value`` is when it is callable but no function returning a consumer (a
    handler, a registry, a function or class that needs arguments); None otherwise."""
    if isinstance(value, Consumer) or not callable(value):
        return None
    spec = getattr(value, _ROUTE_ATTR, None)
    if isinstance(spec, RouteSpec):
        key = f"event type {spec.event_type!r}" if spec.event_type else f"topic {spec.topic!r}"
        return f"a {'batch ' if spec.batch else ''}handler (of {key})"
    if isinstance(value, HandlerRegistry):
        return "a HandlerRegistry"
    if value is Consumer:
        return "the Consumer class"
    try:
        parameters = inspect.signature(value).parameters.values()
    except (TypeError, ValueError):  # no signature to read: try calling it
        return None
    needed = [p.name for p in parameters if p.default is p.empty
              and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if needed:
        kind = "class" if inspect.isclass(value) else "function"
        return f"a {kind} that needs arguments ({', '.join(needed)})"
    return None


def _article(name: str) -> str:
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"
