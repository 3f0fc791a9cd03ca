"""Which topic an outbox event goes to: a template over the event's fields, like the
EventRouter's route-by-field (``"{aggregate_type}"``, ``"events.{event_type}"``)."""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

from ..errors import ConfigurationError
from .event import OutboxEvent
from .sink import PermanentSendError

FIELDS = frozenset({"event_type", "aggregate_type"})
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")


def check_topic(name: str) -> str:
    """``name`` if Kafka accepts it as a topic name (1-249 of ``A-Za-z0-9._-``, not ``.``
    or ``..``), else :class:`ConfigurationError`."""
    if not _TOPIC.fullmatch(name) or name in (".", ".."):
        raise ConfigurationError(
            f"invalid topic name {name!r}: use 1-249 characters of letters, digits, '.', '_' "
            "and '-'")
    return name


@dataclass(frozen=True, slots=True)
class TopicRoute:
    """A topic name template; ``{event_type}`` and ``{aggregate_type}`` are replaced by the
    event's values. A template without fields sends everything to one topic."""

    template: str = "{aggregate_type}"

    def __post_init__(self) -> None:
        names = {f for _, f, _, _ in string.Formatter().parse(self.template) if f is not None}
        unknown = names - FIELDS
        if unknown:
            raise ConfigurationError(
                f"topic template {self.template!r}: unknown fields {sorted(unknown)}; "
                f"use {sorted(FIELDS)}")
        check_topic(self.template.format(event_type="x", aggregate_type="x"))

    @property
    def fixed(self) -> str | None:
        """The one topic of a template without fields; None for a template with some."""
        parsed = string.Formatter().parse(self.template)
        return None if any(f is not None for _, f, _, _ in parsed) else self.template

    def topic(self, event: OutboxEvent) -> str:
        """The event's topic; :class:`PermanentSendError` if the result is no valid topic
        name (retrying cannot change it)."""
        name = self.template.format(event_type=event.event_type,
                                    aggregate_type=event.aggregate_type)
        try:
            return check_topic(name)
        except ConfigurationError as exc:
            raise PermanentSendError(str(exc)) from None
