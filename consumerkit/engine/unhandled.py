"""What becomes of a record whose event type no handler of the consumer takes: dead-lettered
(``unknown_event_type``) or skipped (counted per type, nothing written, the offset moves on).
The decoder asks :class:`TypePolicy` once per event type; ``consumerkit check`` asks it too."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Literal

from ..errors import ConfigurationError, DecodeError
from ..route_table import RouteTable

Unhandled = Literal["dead_letter", "skip"]
UNHANDLED: tuple[Unhandled, ...] = ("dead_letter", "skip")
NEAR = 0.8  # difflib's ratio from which two event types look like one misspelt


class Skipped(DecodeError):
    """A record this consumer does not take: no handler for its event type, and the consumer
    skips such types (``Unhandled(policy="skip")``) or ignores this one
    (``Unhandled(ignore=...)``). Nothing is written for it; its offset moves on."""

    def __init__(self, event_type: str, near: str | None = None) -> None:
        super().__init__("unhandled_skipped", f"no handler for event type {event_type!r}")
        self.event_type = event_type
        self.near = near  # a handled event type close to it: a misspelt handler?


@dataclass(frozen=True, slots=True)
class TypePolicy:
    """What becomes of an event type no handler takes: ``unhandled`` for every such type,
    except those matching an ``ignore`` pattern (fnmatch-style, case-sensitive), always
    skipped."""

    unhandled: Unhandled = "dead_letter"
    ignore: tuple[str, ...] = ()
    handled: tuple[str, ...] = ()  # the event types of the handlers

    @classmethod
    def build(cls, unhandled: str, ignore: Sequence[str], routes: RouteTable) -> TypePolicy:
        """The policy, or a :class:`ConfigurationError` for an unknown mode or a pattern that
        matches a handled event type (its events would reach the handler anyway)."""
        if unhandled not in UNHANDLED:
            raise ConfigurationError(f"unhandled must be one of {', '.join(UNHANDLED)}, "
                                     f"not {unhandled!r}")
        if isinstance(ignore, str):  # one pattern, not its characters
            ignore = [ignore]
        patterns = tuple(p.strip() for p in ignore if p.strip())
        for pattern in patterns:
            if taken := sorted(t for t in routes.by_type if fnmatchcase(t, pattern)):
                raise ConfigurationError(
                    f"ignore pattern {pattern!r} matches handled event type"
                    f"{'s' if len(taken) > 1 else ''} {', '.join(taken)}: remove the "
                    "pattern or the handler")
        mode: Unhandled = "skip" if unhandled == "skip" else "dead_letter"
        return cls(mode, patterns, tuple(sorted(routes.by_type)))

    def fate(self, event_type: str) -> Unhandled:
        """What becomes of a record of ``event_type`` when no handler takes it."""
        if self.unhandled == "skip" or any(fnmatchcase(event_type, p) for p in self.ignore):
            return "skip"
        return "dead_letter"

    def near(self, event_type: str) -> str | None:
        """A handled event type close to ``event_type`` (``order.craeted`` for
        ``order.created``): the sign of a misspelt handler; ``None`` when none is."""
        close = difflib.get_close_matches(event_type, self.handled, n=1, cutoff=NEAR)
        return close[0] if close else None
