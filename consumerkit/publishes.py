"""What a handler says it publishes: ``@handler("order.created", publishes=[...])``.

A declared handler may emit, through ``ctx.publish``, only the event types it declares; the
consumer's AsyncAPI document lists them as its send operations, with the topic the outbox
relay routes each to. An undeclared event type is a defect of the code, not of the record: it
raises :class:`~consumerkit.errors.UndeclaredEventError` (not retried), so the test kit fails
the test that reaches it. A handler that declares nothing is not checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel

from .errors import HandlerDefinitionError, UndeclaredEventError
from .versions import check_version


@dataclass(frozen=True, slots=True)
class Publishes:
    """An event type a handler emits through the outbox: its payload model and its aggregate
    type (which the relay's default route, ``{aggregate_type}``, names the topic after). The
    version is the model's ``__event_version__`` unless given."""

    event_type: str
    model: type[BaseModel]
    aggregate_type: str
    version: int | None = None

    def __post_init__(self) -> None:
        for name in ("event_type", "aggregate_type"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise HandlerDefinitionError(f"Publishes {name} must be a non-empty string, "
                                             f"not {value!r}")
        if not isinstance(self.model, type) or not issubclass(self.model, BaseModel):
            raise HandlerDefinitionError(f"Publishes {self.event_type!r}: model must be a "
                                         f"pydantic model class, not {self.model!r}")
        if self.version is not None:
            check_version(self.version, f"Publishes {self.event_type!r} version")


def checked(publishes: Sequence[Publishes] | None) -> tuple[Publishes, ...] | None:
    """``publishes`` checked: each a :class:`Publishes`, no event type twice."""
    if publishes is None:
        return None
    if isinstance(publishes, str | bytes) or not isinstance(publishes, Sequence):
        raise HandlerDefinitionError("publishes= takes a list of Publishes(...)")
    seen: set[str] = set()
    for entry in publishes:
        if not isinstance(entry, Publishes):
            raise HandlerDefinitionError(
                f"publishes= takes Publishes(event_type, model, aggregate_type), not {entry!r}")
        if entry.event_type in seen:
            raise HandlerDefinitionError(f"publishes= names {entry.event_type!r} twice")
        seen.add(entry.event_type)
    return tuple(publishes)


def check_published(publishes: tuple[Publishes, ...] | None, handler: str,
                    event_type: str) -> None:
    """Refuse ``event_type`` unless the handler declares it (or declares nothing)."""
    if publishes is None or any(p.event_type == event_type for p in publishes):
        return
    names = ", ".join(repr(p.event_type) for p in publishes) or "nothing"
    raise UndeclaredEventError(
        f"handler {handler} published {event_type!r}, which it does not declare "
        f"(@handler(..., publishes=[...]) declares {names})")
