"""Handlers and the explicit registries that collect them.

``@handler("order.created")`` attaches a route to an ``async def`` and returns the function
unchanged; ``@handler("order.created", batch=True)`` marks a batch handler, called with a list
of events and a :class:`~consumerkit.BatchContext`. Nothing is registered globally: a
:class:`HandlerRegistry` collects handlers from functions, modules and other registries, and a
consumer is given its handlers explicitly.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, TypeVar, cast

from pydantic import BaseModel

from .context import BatchContext, HandlerContext
from .errors import HandlerDefinitionError
from .publishes import Publishes, checked
from .versions import (
    U,
    Upcaster,
    UpcasterSpec,
    check_version,
    model_version,
    upcaster,
    upcaster_spec,
)

HandlerFunc = Callable[[Any, HandlerContext], Awaitable[None]]
BatchHandlerFunc = Callable[[list[Any], BatchContext], Awaitable[None]]
F = TypeVar("F", bound=Callable[..., Awaitable[None]])

_ROUTE_ATTR = "__consumerkit_route__"

OnExhausted = Literal["dead_letter", "park"]
"""What happens to a record whose handler cannot apply it: dead-letter it, or park its key."""


@dataclass(frozen=True, slots=True)
class RouteSpec:
    """What ``@handler`` attaches: the event type or topic a function handles, and whether
    it takes a batch of events."""

    event_type: str | None
    topic: str | None
    batch: bool = False
    on_exhausted: OnExhausted | None = None
    version: int | None = None
    publishes: tuple[Publishes, ...] | None = None


@dataclass(frozen=True, slots=True)
class Route:
    """A resolved handler: its key, its payload model and the function to call (with one
    event and a :class:`HandlerContext`, or with ``batch`` a list and a :class:`BatchContext`).
    """

    event_type: str | None
    topic: str | None
    model: type[BaseModel]
    func: Callable[[Any, Any], Awaitable[None]]
    name: str
    batch: bool = False
    on_exhausted: OnExhausted | None = None  # None: the consumer's RetryPolicy decides
    version: int = 1  # the event schema version the handler takes (see consumerkit.versions)
    publishes: tuple[Publishes, ...] | None = None  # None: not declared, not checked


def handler(event_type: str | None = None, *, topic: str | None = None,
            batch: bool = False, on_exhausted: OnExhausted | None = None,
            version: int | None = None,
            publishes: Sequence[Publishes] | None = None) -> Callable[[F], F]:
    """Mark an ``async def`` as the handler of ``event_type`` (or of every event on ``topic``).

    The function's first parameter must be annotated with a pydantic model (the payload) and
    its second receives the :class:`~consumerkit.HandlerContext`. With ``batch=True`` the first
    is annotated ``list[Model]`` and receives the fresh events of a batch, in per-key order,
    and the second a :class:`~consumerkit.BatchContext`. The function is returned unchanged;
    collect it with :class:`HandlerRegistry` or pass it to a consumer directly.

    ``on_exhausted`` says what becomes of a record this handler cannot apply (its retries
    ran out, or it raised a non-retriable error): ``"dead_letter"``, or ``"park"`` its key
    (the record and every later one of its key on the partition wait, in order, for
    ``consumerkit parked replay``). ``None`` follows the consumer's
    :class:`~consumerkit.RetryPolicy`.

    ``version`` is the event schema version the handler takes (default: the payload model's
    ``__event_version__``, else 1); older versions reach it through upcasters.

    ``publishes`` lists the events it emits with ``ctx.publish`` (:mod:`consumerkit.publishes`):
    the AsyncAPI document shows them, and an undeclared one raises.
    """
    published = checked(publishes)
    if version is not None:
        check_version(version, "@handler version")
    if on_exhausted not in (None, "dead_letter", "park"):
        raise HandlerDefinitionError(
            f"on_exhausted must be 'dead_letter' or 'park', not {on_exhausted!r}")
    if (event_type is None) == (topic is None):
        raise HandlerDefinitionError("@handler needs exactly one of an event type or topic=")
    for value in (event_type, topic):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise HandlerDefinitionError(f"@handler got an empty or non-string key {value!r}")

    def attach(func: F) -> F:
        _check_async(func)
        setattr(func, _ROUTE_ATTR,
                RouteSpec(event_type, topic, bool(batch), on_exhausted, version, published))
        return func

    return attach


def _check_async(func: object) -> None:
    if not inspect.iscoroutinefunction(func):
        raise HandlerDefinitionError(
            f"handler {_name(func)} must be declared with 'async def'"
        )


def _name(func: object) -> str:
    module = getattr(func, "__module__", "?")
    return f"{module}.{getattr(func, '__qualname__', repr(func))}"


def resolve(func: Callable[..., Awaitable[None]]) -> Route:
    """Turn a decorated function into a :class:`Route`, resolving its payload annotation."""
    spec = getattr(func, _ROUTE_ATTR, None)
    if not isinstance(spec, RouteSpec):
        raise HandlerDefinitionError(
            f"{_name(func)} is not a handler: decorate it with @handler(...)"
        )
    _check_async(func)
    params = list(inspect.signature(func).parameters.values())
    if len(params) != 2:
        raise HandlerDefinitionError(
            f"handler {_name(func)} must take (event, ctx), got {len(params)} parameters"
        )
    try:
        hints = typing.get_type_hints(func)
    except Exception as exc:
        raise HandlerDefinitionError(
            f"cannot resolve the annotations of handler {_name(func)}: {exc}"
        ) from exc
    annotation = hints.get(params[0].name)
    if spec.batch:
        args = typing.get_args(annotation) if typing.get_origin(annotation) is list else ()
        model = args[0] if len(args) == 1 else None
        if not _is_model(model):
            raise HandlerDefinitionError(
                f"the first parameter of batch handler {_name(func)} must be annotated "
                f"list[Model] with a pydantic model, got {annotation!r}"
            )
    else:
        model = annotation
        if not _is_model(model):
            hint = (" (a list of events needs @handler(..., batch=True))"
                    if typing.get_origin(annotation) is list else "")
            raise HandlerDefinitionError(
                f"the first parameter of handler {_name(func)} must be annotated with a "
                f"pydantic model, got {annotation!r}{hint}"
            )
    assert isinstance(model, type)
    declared = model_version(model)
    if spec.version is not None and declared is not None and spec.version != declared:
        raise HandlerDefinitionError(
            f"handler {_name(func)} takes version {spec.version}, but its model "
            f"{model.__qualname__} declares version {declared}")
    return Route(spec.event_type, spec.topic, model, func, _name(func), spec.batch,
                 spec.on_exhausted, spec.version or declared or 1, spec.publishes)


def _is_model(annotation: object) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


HandlerSource: TypeAlias = (
    "Callable[..., Awaitable[None]] | Upcaster | HandlerRegistry | types.ModuleType")


class HandlerRegistry:
    """An explicit, composable collection of handlers.

    >>> billing = HandlerRegistry([charge, refund])
    >>> everything = HandlerRegistry().include(billing).include(inventory_module)
    """

    def __init__(self, handlers: Iterable[HandlerSource] = ()) -> None:
        self._funcs: list[Callable[..., Awaitable[None]]] = []
        self._upcasters: list[tuple[UpcasterSpec, Upcaster]] = []
        self._frozen = False
        for item in handlers:
            self.include(item)

    def include(self, source: HandlerSource) -> HandlerRegistry:
        """Add a handler function, every handler of a module, or every handler of a registry
        (with their upcasters)."""
        if self._frozen:
            raise HandlerDefinitionError("this registry is frozen: a consumer is using it")
        if isinstance(source, HandlerRegistry):
            self._funcs.extend(source._funcs)
            self._upcasters.extend(source._upcasters)
        elif isinstance(source, types.ModuleType):
            found = [v for v in vars(source).values() if hasattr(v, _ROUTE_ATTR)]
            if not found:
                raise HandlerDefinitionError(f"module {source.__name__} defines no handlers")
            self._funcs.extend(found)
            self._upcasters.extend((spec, v) for v in vars(source).values()
                                   if (spec := upcaster_spec(v)) is not None)
        elif (spec := upcaster_spec(source)) is not None:
            self._upcasters.append((spec, source))  # type: ignore[arg-type]  # marked above
        elif callable(source):
            func = cast("Callable[..., Awaitable[None]]", source)
            resolve(func) if hasattr(source, _ROUTE_ATTR) else _reject(source)
            self._funcs.append(func)
        else:
            raise HandlerDefinitionError(f"cannot collect handlers from {source!r}")
        return self

    def handler(self, event_type: str | None = None, *, topic: str | None = None,
                batch: bool = False, on_exhausted: OnExhausted | None = None,
                version: int | None = None,
                publishes: Sequence[Publishes] | None = None) -> Callable[[F], F]:
        """``@registry.handler("x")``: like :func:`handler`, and add the function here."""
        def attach(func: F) -> F:
            handler(event_type, topic=topic, batch=batch, on_exhausted=on_exhausted,
                    version=version, publishes=publishes)(func)
            self.include(func)
            return func
        return attach

    def upcaster(self, event_type: str, *, from_version: int) -> Callable[[U], U]:
        """``@registry.upcaster("x", from_version=1)``: a plain function turning the JSON
        document of version ``from_version`` of ``x`` into the next version's (see
        :mod:`consumerkit.versions`)."""
        def attach(func: U) -> U:
            upcaster(event_type, from_version=from_version)(func)
            self.include(func)
            return func
        return attach

    def upcasters(self) -> list[tuple[UpcasterSpec, Upcaster]]:
        return list(self._upcasters)

    def freeze(self) -> None:
        """Refuse further changes (a consumer freezes its registry when it starts)."""
        self._frozen = True

    def routes(self) -> Iterator[Route]:
        seen: set[int] = set()
        for func in self._funcs:
            if id(func) not in seen:
                seen.add(id(func))
                yield resolve(func)

    def __len__(self) -> int:
        return len({id(f) for f in self._funcs})


def _reject(source: object) -> None:
    _check_async(source)
    raise HandlerDefinitionError(f"{_name(source)} is not a handler: decorate it with @handler")
