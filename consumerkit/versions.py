"""Event schema versions, and the upcasters that carry an old event to its handler's version.

An event's version travels in a header (``event_version`` by default, absent = 1). A handler
takes one version: ``@handler("order.created", version=3)``, or the ``__event_version__`` of
its payload model. An upcaster is a plain function on the decoded JSON document that turns
version ``n`` into ``n + 1``; the upcasters of an event type must cover every version from 1
up to its handler's, which is checked when the consumer builds its routes
(:class:`~consumerkit.errors.UpcasterChainError` names each gap). The decoder runs the chain
before validation, so a live record, a parked replay and a republished dead letter take the
same path. A version newer than the handler knows is dead-lettered as ``unknown_version``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from .errors import DecodeError, HandlerDefinitionError, UpcasterChainError

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
U = TypeVar("U", bound=Upcaster)

VERSION_ATTR = "__event_version__"
_UPCASTER_ATTR = "__consumerkit_upcaster__"
_MAX_VERSION = 1_000_000  # a header beyond this is a broken record, not a schema


@dataclass(frozen=True, slots=True)
class UpcasterSpec:
    """What ``@upcaster`` attaches: the event type and the version the function reads."""

    event_type: str
    from_version: int


def check_version(value: object, what: str) -> int:
    """``value`` as a schema version (an int from 1), or :class:`HandlerDefinitionError`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MAX_VERSION:
        raise HandlerDefinitionError(f"{what} must be an integer from 1, got {value!r}")
    return value


def model_version(model: type) -> int | None:
    """The version a payload model declares with ``__event_version__``, if it does."""
    declared = getattr(model, VERSION_ATTR, None)
    if declared is None:
        return None
    return check_version(declared, f"{model.__qualname__}.{VERSION_ATTR}")


def upcaster(event_type: str, *, from_version: int) -> Callable[[U], U]:
    """Mark a plain function as the upcaster of ``event_type`` from ``from_version`` to the
    next: it takes the decoded JSON document (a dict) and returns the next version's. Collect
    it with :class:`~consumerkit.HandlerRegistry`, or use ``@registry.upcaster(...)``."""
    if not isinstance(event_type, str) or not event_type.strip():
        raise HandlerDefinitionError(f"@upcaster needs an event type, got {event_type!r}")
    check_version(from_version, "@upcaster from_version")

    def attach(func: U) -> U:
        if inspect.iscoroutinefunction(func) or not callable(func):
            raise HandlerDefinitionError(
                f"upcaster {getattr(func, '__qualname__', func)!r} must be a plain function "
                "(not async): it only reshapes a JSON document")
        setattr(func, _UPCASTER_ATTR, UpcasterSpec(event_type, from_version))
        return func

    return attach


def upcaster_spec(func: object) -> UpcasterSpec | None:
    spec = getattr(func, _UPCASTER_ATTR, None)
    return spec if isinstance(spec, UpcasterSpec) else None


@dataclass(frozen=True, slots=True)
class Chain:
    """The upcasters of one event type: ``steps[i]`` turns version ``i + 1`` into ``i + 2``."""

    event_type: str
    target: int
    steps: tuple[Upcaster, ...]

    def upcast(self, doc: object, version: int) -> dict[str, Any]:
        """``doc`` (version ``version``) as the handler's version, or :class:`DecodeError`."""
        for step in range(version, self.target):
            if not isinstance(doc, dict):
                raise DecodeError("upcast_failed", f"version {step} of {self.event_type!r} is "
                                  f"a JSON {type(doc).__name__}, not an object")
            func = self.steps[step - 1]
            try:
                doc = func(doc)
            except Exception as exc:  # a user's function: its failure is the record's reason
                raise DecodeError(
                    "upcast_failed", f"upcaster of {self.event_type!r} from version {step}: "
                    f"{type(exc).__name__}: {exc}"[:500]) from exc
        if not isinstance(doc, dict):
            raise DecodeError("upcast_failed", f"the upcasters of {self.event_type!r} returned "
                              f"a {type(doc).__name__}, not a dict")
        return doc


def build_chains(
    versions: Mapping[str, int], upcasters: Iterable[tuple[UpcasterSpec, Upcaster]],
) -> dict[str, Chain]:
    """The chain of each event type, from its handler's version and the upcasters given;
    :class:`UpcasterChainError` names every gap, double, stray or useless upcaster."""
    found: dict[str, dict[int, Upcaster]] = {}
    problems: list[str] = []
    for spec, func in upcasters:
        steps = found.setdefault(spec.event_type, {})
        if spec.from_version in steps and steps[spec.from_version] is not func:
            problems.append(f"two upcasters of {spec.event_type!r} from version "
                            f"{spec.from_version}")
        steps[spec.from_version] = func
    chains: dict[str, Chain] = {}
    for event_type in sorted(set(found) - set(versions)):
        problems.append(f"upcasters of {event_type!r}, which has no handler")
    for event_type, target in sorted(versions.items()):
        steps = found.get(event_type, {})
        missing = [v for v in range(1, target) if v not in steps]
        if missing:
            problems.append(
                f"{event_type!r} (handler takes version {target}) has no upcaster from "
                f"version {', '.join(map(str, missing))}")
        beyond = sorted(v for v in steps if v >= target)
        if beyond:
            problems.append(f"{event_type!r} has an upcaster from version {beyond[0]}, but its "
                            f"handler takes version {target}")
        if target > 1 and not missing:
            chains[event_type] = Chain(event_type, target,
                                       tuple(steps[v] for v in range(1, target)))
    if problems:
        raise UpcasterChainError("upcaster chain: " + "; ".join(problems))
    return chains


def read_version(raw: bytes | None, header: str) -> int:
    """The version in header ``header`` (absent = 1), or :class:`DecodeError`."""
    if raw is None:
        return 1
    text = raw.decode(errors="replace").strip()
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= _MAX_VERSION:
        raise DecodeError("invalid_header",
                          f"header {header!r} is not a version from 1: {text[:32]!r}")
    return int(text)


def upcast_json(value: bytes, event_type: str | None, version: int, target: int,
                chain: Chain | None) -> bytes:
    """The payload of a record of ``version`` as the JSON of version ``target``: JSON again,
    so the model validates it in the same (JSON) mode as a current record, where a strict
    model takes a timestamp or a UUID as a string."""
    if version > target:
        raise DecodeError(
            "unknown_version", f"event version {version} of {event_type or 'this topic'!r} "
                               f"is newer than its handler takes ({target})")
    if chain is None:  # only a topic route lacks a chain below its version: no upcasters
        raise DecodeError("upcast_failed", f"no upcasters from version {version} to {target} "
                          f"for {event_type or 'this topic'!r}")
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise DecodeError("invalid_json", str(exc)) from exc
    doc = chain.upcast(doc, version)
    try:
        return orjson.dumps(doc)
    except orjson.JSONEncodeError as exc:
        raise DecodeError("upcast_failed", f"the upcasters of {event_type or 'this topic'!r} "
                          f"returned what JSON cannot hold: {exc}"[:500]) from exc
