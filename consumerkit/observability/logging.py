"""Outcome log lines, written from the observer seam with the message's fields
(:data:`consumerkit.logs.MESSAGE_FIELDS`) as record attributes."""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import TYPE_CHECKING

from ..display import describe
from .observer import BaseObserver

if TYPE_CHECKING:
    from ..envelope import Envelope, RecordLike

_log = logging.getLogger("consumerkit.pipeline")
_SKIPPED_TYPES_LOGGED = 10_000  # bounds the memory of "logged once per type"


def message_fields(
    record: RecordLike | None, envelope: Envelope | None, *, handler: str = "",
    attempt: int | None = None, consumer: str | None = None,
) -> dict[str, object]:
    """The :data:`~consumerkit.logs.MESSAGE_FIELDS` that apply, for ``extra=``."""
    fields: dict[str, object] = {}
    if envelope is not None:
        fields.update(event_id=envelope.event_id, event_type=envelope.event_type,
                      key=envelope.key, topic=envelope.topic, partition=envelope.partition,
                      offset=envelope.offset)
    elif record is not None:
        key = record.key
        fields.update(key=key.decode(errors="replace")[:200] if key is not None else None,
                      topic=record.topic, partition=record.partition, offset=record.offset)
    if handler:
        fields["handler"] = handler
    if attempt is not None:
        fields["attempt"] = attempt
    if consumer is not None:
        fields["consumer"] = consumer
    return fields


class LogObserver(BaseObserver):
    """Logs retries, dead letters, parked records and expired skips as warnings, duplicates at
    debug level, each record carrying the message's fields; stalls, and readiness changes."""

    __slots__ = ("_skipped", "_stalled_at", "consumer", "log")

    def __init__(self, consumer: str, log: logging.Logger = _log) -> None:
        self.consumer = consumer
        self.log = log
        self._stalled_at: float | None = None
        self._skipped: set[str] = set()  # event types skipped so far: logged the first time

    def unhandled_skipped(self, record: RecordLike, event_type: str, near: str | None) -> None:
        if event_type in self._skipped or len(self._skipped) >= _SKIPPED_TYPES_LOGGED:
            return
        self._skipped.add(event_type)
        fields = message_fields(record, None, consumer=self.consumer)
        if near is not None:  # the one a handler was meant for, its name misspelt?
            self.log.warning("skipping event type %r: no handler of consumer %s takes it, but "
                             "one takes %r: misspelt? (logged once per type)",
                             event_type[:200], self.consumer, near, extra=fields)
            return
        self.log.info("skipping event type %r: no handler of consumer %s takes it (counted "
                      "in consumerkit_unhandled_skipped_total; logged once per type)",
                      event_type[:200], self.consumer, extra=fields)

    def stalled(self, reason: str | None) -> None:
        if reason is not None:
            self._stalled_at = time.monotonic()
            self.log.error("consumer %s stalled: %s; it takes no new records and tries again "
                           "until this passes (nothing is dead-lettered for it)", self.consumer,
                           reason, extra={"consumer": self.consumer})
        elif self._stalled_at is not None:
            self.log.warning("consumer %s resumed after a stall of %.1fs", self.consumer,
                             time.monotonic() - self._stalled_at,
                             extra={"consumer": self.consumer})
            self._stalled_at = None

    def duplicate(self, record: RecordLike, envelope: Envelope | None, handler: str,
                  original_seen_at: datetime | None) -> None:
        if self.log.isEnabledFor(logging.DEBUG):
            self.log.debug("duplicate %s (first seen %s)",
                           envelope.event_id if envelope else f"at offset {record.offset}",
                           original_seen_at, extra=message_fields(
                               record, envelope, handler=handler, consumer=self.consumer))

    def dead_lettered(self, record: RecordLike, envelope: Envelope | None, handler: str,
                      reason: str, detail: str, attempts: int) -> None:
        self.log.warning("dead-lettered %s/%d/%d: %s: %s", record.topic, record.partition,
                         record.offset, reason, detail, extra=message_fields(
                             record, envelope, handler=handler, attempt=attempts,
                             consumer=self.consumer))

    def parked(self, record: RecordLike, envelope: Envelope | None, handler: str,
               reason: str, detail: str, attempts: int) -> None:
        self.log.warning("parked %s/%d/%d: %s: %s", record.topic, record.partition,
                         record.offset, reason, detail, extra=message_fields(
                             record, envelope, handler=handler, attempt=attempts or None,
                             consumer=self.consumer))

    def expired_skipped(self, record: RecordLike, envelope: Envelope, handler: str) -> None:
        self.log.warning("skipped %s: older than the dedup window", envelope.event_id,
                         extra=message_fields(record, envelope, handler=handler,
                                              consumer=self.consumer))

    def retry(self, record: RecordLike, envelope: Envelope, handler: str, attempt: int,
              delay: float, error: BaseException) -> None:
        self.log.warning("handler %s failed on %s (attempt %d), retrying in %.2fs: %s",
                         handler, envelope.event_id, attempt, delay,
                         describe(error),
                         extra=message_fields(record, envelope, handler=handler,
                                              attempt=attempt, consumer=self.consumer))

    def offsets_moved_back(self, topic: str, partition: int, stored: int | None,
                           position: int) -> None:
        self.log.warning(
            "%s/%d: the database moved back: it lacks commits this consumer saw answered (a "
            "failover to a standby that missed them, a restore?); reading the partition again "
            "from the stored offset %s (the consumer was at %d)", topic, partition,
            "none" if stored is None else stored, position,
            extra={"consumer": self.consumer, "topic": topic, "partition": partition})

    def readiness(self, role: str, name: str, reason: str | None) -> None:
        if reason is None:
            self.log.info("%s %s is ready", role, name)
        else:
            self.log.info("%s %s is not ready: %s", role, name, reason)
