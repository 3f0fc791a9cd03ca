"""What a TestConsumer watches: each settled delivery (through the observer seam, like the
metrics), each dead letter, each handler failure. None of it changes what the consumer does."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from ..context import BatchContext, HandlerContext
from ..deadletter.entry import DeadLetterEntry
from ..engine.pipeline import Outcome
from ..envelope import Envelope, RecordLike
from ..errors import HandlerSignal
from ..observability.observer import BaseObserver
from ..route_table import RouteTable
from ..types import SinkResources


@dataclasses.dataclass(frozen=True, slots=True)
class Settled:
    """One delivery the consumer finished with, and how."""

    record: RecordLike
    outcome: Outcome
    event_id: str | None


class OutcomeRecorder(BaseObserver):
    """An observer that hands each settled delivery and its outcome to ``settle``."""

    __slots__ = ("settle",)

    def __init__(self, settle: Callable[[RecordLike, Outcome, Envelope | None], None]) -> None:
        self.settle = settle

    def applied(self, record: RecordLike, envelope: Envelope, handler: str) -> None:
        self.settle(record, Outcome.APPLIED, envelope)

    def duplicate(self, record: RecordLike, envelope: Envelope | None, handler: str,
                  original_seen_at: datetime | None) -> None:
        self.settle(record, Outcome.DUPLICATE, envelope)

    def dead_lettered(self, record: RecordLike, envelope: Envelope | None, handler: str,
                      reason: str, detail: str, attempts: int) -> None:
        self.settle(record, Outcome.DEAD_LETTERED, envelope)

    def expired_skipped(self, record: RecordLike, envelope: Envelope, handler: str) -> None:
        self.settle(record, Outcome.EXPIRED_SKIPPED, envelope)

    def unhandled_skipped(self, record: RecordLike, event_type: str, near: str | None) -> None:
        self.settle(record, Outcome.UNHANDLED_SKIPPED, None)

    def parked(self, record: RecordLike, envelope: Envelope | None, handler: str,
               reason: str, detail: str, attempts: int) -> None:
        self.settle(record, Outcome.PARKED, envelope)


class DeadLetterRecorder:
    """A dead-letter sink that keeps the entries for the test to look at."""

    def __init__(self) -> None:
        self.entries: list[DeadLetterEntry] = []

    async def open(self, resources: SinkResources) -> None:
        return None

    async def send(self, entry: DeadLetterEntry) -> None:
        self.entries.append(entry)

    async def close(self) -> None:
        return None


def observe_handlers(routes: RouteTable, errors: list[BaseException]) -> None:
    """Append to ``errors`` every failure a handler of ``routes`` raises (signals are control
    flow, not failures); the handler itself runs unchanged, inside the pipeline's
    transaction, and the failure goes on to the pipeline as before."""
    for table in (routes.by_type, routes.by_topic):
        for key, route in table.items():
            table[key] = dataclasses.replace(route, func=_observed(route.func, errors))


Handler = Callable[[Any, Any], Awaitable[None]]


def _observed(func: Handler, errors: list[BaseException]) -> Handler:
    async def observed(event: Any, ctx: HandlerContext | BatchContext) -> None:
        try:
            await func(event, ctx)
        except HandlerSignal:
            raise
        except Exception as exc:
            errors.append(exc)
            raise

    return observed
