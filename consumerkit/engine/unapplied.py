"""Records that will not be applied: a key parked with its records (``on_exhausted="park"``,
or an earlier record of the key parked) or a record sent to the dead letters (undecodable,
refused, out of retries, expired). :class:`~consumerkit.engine.pipeline.Pipeline` holds one
and calls it to end a record without its effect."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..deadletter.entry import DeadLetterEntry
from ..deadletter.writer import DeadLetterWriter
from ..envelope import RecordLike
from ..errors import DecodeError
from ..observability.observer import Observer
from ..retry import RetryPolicy
from ..stats import ConsumerStats
from .decode import Decoded, Decoder, header_map
from .outcome import Outcome
from .unhandled import Skipped

if TYPE_CHECKING:
    from ..parking.lot import ParkingLot


class Unapplied:
    """Parks a record's key, or writes its dead letter, and tells ``observe``."""

    def __init__(self, *, consumer: str, parking: ParkingLot | None, retry: RetryPolicy,
                 decoder: Decoder, dead_letters: DeadLetterWriter, stats: ConsumerStats,
                 observe: Observer) -> None:
        self.consumer = consumer
        self.parking = parking
        self.retry = retry
        self.decoder = decoder
        self.dead_letters = dead_letters
        self.stats = stats
        self.observe = observe

    async def exhausted(
        self, record: RecordLike, decoded: Decoded, reason: str, detail: str, attempts: int,
        abandon: asyncio.Event,
    ) -> Outcome:
        """A decoded record that will not be applied: its handler refused it, or its retries
        ran out. Its key is parked when its handler (or the policy) says so and the handler
        did not ask for the dead letters itself; else it goes to the dead letters."""
        if (self.parking is not None and record.key is not None
                and reason != "dead_lettered_by_handler"
                and (decoded.route.on_exhausted or self.retry.on_exhausted) == "park"):
            outcome = await self._park([(record, decoded)], reason, detail, attempts, abandon,
                                       start=True)
            if outcome is not None:
                return outcome
        return await self.dead_letter(record, reason, detail, attempts, decoded, abandon)

    async def join_park(self, records: Sequence[RecordLike], abandon: asyncio.Event,
                        decoded: Decoded | None = None) -> Outcome | None:
        """``PARKED`` when the key of ``records`` (consecutive records of one key) is parked
        on their partition: they join its park, in order, undecodable ones too. ``None``:
        apply them as usual (the check is in memory; the database is asked only then)."""
        if self.parking is None or not await self.parking.holds(records[0]):
            return None
        items = [(r, decoded if decoded is not None else self._decoded_or_none(r))
                 for r in records]
        return await self._park(items, "key_parked", "", 0, abandon, start=False)

    async def _park(self, items: Sequence[tuple[RecordLike, Decoded | None]], reason: str,
                    detail: str, attempts: int, abandon: asyncio.Event, *, start: bool,
                    ) -> Outcome | None:
        assert self.parking is not None
        stored = await self.parking.park(items, reason=reason, detail=detail,
                                         attempts=attempts, start=start, abandon=abandon)
        if stored is None:
            self.observe.abandoned([record for record, _ in items])
            return Outcome.ABANDONED
        return Outcome.PARKED if stored else None  # False: unparked meanwhile

    def _decoded_or_none(self, record: RecordLike) -> Decoded | None:
        try:
            return self.decoder.decode(record)
        except DecodeError:
            return None

    async def expired_dead_letter(self, record: RecordLike, decoded: Decoded, attempt: int,
                                  abandon: asyncio.Event) -> Outcome:
        """An expired record, to the dead letters (the ``dead_letter`` expired policy)."""
        when = decoded.envelope.event_time
        detail = (f"event time {when.isoformat() if when else '?'} is older than the dedup "
                  "retention; the original may have been forgotten")
        return await self.dead_letter(record, "expired", detail, attempt, decoded, abandon)

    async def undecodable(self, record: RecordLike, error: DecodeError,
                          abandon: asyncio.Event) -> Outcome:
        """A record that is no event for this consumer: skipped when no handler takes its
        event type and the consumer skips such types (nothing written, the offset moves on),
        else to the dead letters."""
        if isinstance(error, Skipped):
            self.observe.unhandled_skipped(record, error.event_type, error.near)
            return Outcome.UNHANDLED_SKIPPED
        return await self.dead_letter(record, error.reason, error.detail, 0, None, abandon)

    async def dead_letter(
        self, record: RecordLike, reason: str, detail: str, attempts: int,
        decoded: Decoded | None, abandon: asyncio.Event,
    ) -> Outcome:
        headers = header_map(record)
        wire = self.decoder.wire
        entry = DeadLetterEntry(
            consumer=self.consumer, topic=record.topic, partition=record.partition,
            offset=record.offset, key=record.key, value=record.value,
            headers=list(record.headers or ()), reason=reason, detail=detail, attempts=attempts,
            event_id=decoded.envelope.event_id if decoded else _lenient(headers, wire.id_header),
            event_type=decoded.envelope.event_type if decoded else _lenient(
                headers, wire.event_type_header),
        )
        if not await self.dead_letters.write(entry, abandon):
            return self.abandoned(record)
        self.stats.dead_letter_failures = self.dead_letters.failures
        self.observe.dead_lettered(record, decoded.envelope if decoded else None,
                                   decoded.route.name if decoded else "", reason, detail,
                                   attempts)
        return Outcome.DEAD_LETTERED

    def abandoned(self, record: RecordLike) -> Outcome:
        self.observe.abandoned((record,))
        return Outcome.ABANDONED


def _lenient(headers: dict[str, bytes], name: str) -> str | None:
    raw = headers.get(name)
    return raw.decode(errors="replace")[:200] if raw is not None else None
