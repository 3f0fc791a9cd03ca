"""How the records of a lane's group get their outcomes once its batch has ended: each settled
at once when nothing has to wait (applied, duplicate, skipped), one by one with retries when
the batch rolled back, an expired one through the dead letters; and the bookkeeping of a
group settled in a task, whose records left without an outcome count as abandoned."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..envelope import RecordLike
from ..types import Claim
from .decode import Decoded
from .handling import RecordFailed
from .pipeline import Outcome, Pipeline

Report = Callable[[RecordLike, Outcome], None]


@dataclass(frozen=True, slots=True)
class RolledBack:
    """The batch rolled back; ``failed`` is the handler failure that caused it, if any."""

    failed: RecordFailed | None = None


Result = list[Claim] | RolledBack


class Owner(Protocol):
    """Who handed a group in with :meth:`~consumerkit.engine.batch.Batcher.submit`: the lanes of
    one partition."""

    abandon: asyncio.Event  # set: the partition is revoked, or the consumer stops
    running: set[asyncio.Task[None]]  # tasks holding its records: a revocation cancels them

    def report(self, record: RecordLike, outcome: Outcome) -> None:
        """A record's final outcome (``ABANDONED``: not finished)."""

    def finished(self, lane: Hashable, records: list[RecordLike]) -> None:
        """Every record of a group has its outcome: its lane may go on."""


Body = Callable[[Sequence[RecordLike], asyncio.Event, Report], Coroutine[Any, Any, None]]
"""A coroutine settling records: ``(records, abandon, report)``."""


async def accounted(
    pipeline: Pipeline, records: Sequence[RecordLike], abandon: asyncio.Event,
    report: Report, body: Body,
) -> None:
    """Run ``body``, counting the records it left without an outcome as abandoned."""
    reported: list[RecordLike] = []

    def final(record: RecordLike, outcome: Outcome) -> None:
        reported.append(record)  # an ABANDONED outcome is counted by the pipeline itself
        report(record, outcome)

    try:
        await body(records, abandon, final)
    finally:
        if len(reported) < len(records):
            done = {id(record) for record in reported}
            pipeline.observe.abandoned([r for r in records if id(r) not in done])


async def conclude(pipeline: Pipeline, good: list[tuple[RecordLike, Decoded]],
                   result: Result, abandon: asyncio.Event, report: Report) -> None:
    """Settle the records of a group whose batch ended: one by one, with retries, if
    it rolled back."""
    if isinstance(result, RolledBack):
        culprit = result.failed
        for record, decoded in good:
            if abandon.is_set():
                return
            failed = culprit if culprit and culprit.item is decoded else None
            report(record, await pipeline.process_decoded(record, decoded, abandon, failed))
        return
    at = settle_now(pipeline, good, result, 0, report)
    while at < len(good):  # an expired record, to the dead letters
        record, decoded = good[at]
        report(record, await pipeline.unapplied.expired_dead_letter(record, decoded, 1, abandon))
        at = settle_now(pipeline, good, result, at + 1, report)


def settle_now(pipeline: Pipeline, good: list[tuple[RecordLike, Decoded]],
               claims: list[Claim], start: int, report: Report) -> int:
    """Settle records from ``start`` as long as none has to wait; the index of the first
    that does (an expired record bound for the dead letters), or the end."""
    settled = pipeline.settled
    for at in range(start, len(good)):
        record, decoded = good[at]
        outcome = settled(claims[at], record, decoded)
        if outcome is None:
            return at
        report(record, outcome)
    return len(good)

