"""The Kafka sink: publishes outbox events in the wire format and reports each ack.

Per partition the events go out as consecutive record batches, each one awaited before the
next is sent, while partitions proceed concurrently. The broker appends a record batch whole
or not at all, so when one fails nothing after it on that partition has been sent: a later
event of an aggregate can never reach the broker ahead of an earlier one that failed, with or
without the idempotent producer.

After a failed send (an outage, say) the next batch goes out only once fresh metadata lists its
topics. The producer would otherwise send on its cached metadata, and a broker that came back
without the topic may acknowledge records it never makes readable: Tansu with memory storage
does, see ``tests/outbox/test_broker_restart.py``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import (
    AuthorizationError,
    RecordTooLargeError,
    StartupError,
    TransportError,
    is_retriable,
)
from ..transport.kafka import KafkaProducer
from ..transport.kafka_access import missing_topics
from .event import OutboxEvent
from .routing import TopicRoute
from .sink import PermanentSendError

SINK_DEFAULTS: dict[str, Any] = {
    "max_batch_size": 1_048_576,  # one record batch per partition and relay batch, usually
    "linger_ms": 0,
    "request_timeout_ms": 15_000,
}

CREATE_IT = ("create it (the relay creates no topic), or let the broker create topics on "
             "first use with auto_create_topics=True (consumerkit relay --auto-create-topics)")
log = logging.getLogger("consumerkit.outbox")

_Record = tuple[bytes | None, bytes | None, int | None, Sequence[tuple[str, bytes]]]


def wire_record(event: OutboxEvent) -> _Record:
    """Key = aggregate id, value = payload, timestamp = occurred_at, headers ``id``,
    ``event_type``, ``occurred_at`` (RFC 3339), ``aggregate_type``, then the writer's."""
    headers = [
        ("id", str(event.event_id).encode()),
        ("event_type", event.event_type.encode()),
        ("occurred_at", event.occurred_at.isoformat().encode()),
        ("aggregate_type", event.aggregate_type.encode()),
        *((k, v.encode()) for k, v in event.headers.items()),
    ]
    return (event.aggregate_id.encode(), event.payload,
            int(event.occurred_at.timestamp() * 1000), headers)


def _refused(exc: TransportError) -> bool:
    """Whether the broker refused for good: an error response (it has an ``errno``) that the
    client marks not retriable, such as an invalid topic or a denied authorization. Timeouts
    and lost connections are outages, never refusals."""
    cause = exc.__cause__
    return cause is not None and hasattr(cause, "errno") and not is_retriable(cause)


class KafkaSink:
    """Sends outbox events to the topic ``route`` names, with ``acks="all"``.

    ``kafka_options`` go to aiokafka's producer (TLS, SASL, sizes); the idempotent producer is
    on unless ``enable_idempotence=False`` (needed for brokers without it, such as Tansu).

    The route's topics must exist: a fixed route's topic is checked by :meth:`open` (a
    :class:`StartupError` naming it), and an event routed to a missing topic fails, naming
    it, and is retried as any failed send is (nothing is skipped or lost; the relay sends
    it once the topic is created, or after ``consumerkit outbox retry`` once its attempts
    ran out). ``auto_create_topics=True`` lets a broker that creates
    topics on first use (``auto.create.topics.enable``) do so instead.
    """

    def __init__(self, bootstrap: str, *, route: TopicRoute | str = "{aggregate_type}",
                 kafka_options: Mapping[str, Any] | None = None,
                 auto_create_topics: bool = False) -> None:
        self.route = route if isinstance(route, TopicRoute) else TopicRoute(route)
        self.auto_create_topics = auto_create_topics
        self._producer = KafkaProducer(bootstrap, {**SINK_DEFAULTS, **(kafka_options or {})})
        self._suspect = False  # a send failed: check the topics before trusting metadata again
        self._known: set[str] = set()  # topics the broker listed when last asked
        self._reported: set[str] = set()  # missing topics already logged as errors

    async def open(self) -> None:
        await self._producer.start()
        topic = self.route.fixed
        if topic is None or self.auto_create_topics:
            return
        async def listed() -> set[str]:
            self._known = await self._producer.topics()
            return self._known

        try:
            await missing_topics(listed, [topic], log, self._producer.denied)
        except StartupError:
            await self._producer.stop()
            raise
        if topic not in self._known:
            await self._producer.stop()
            denied = await self._producer.denied([topic])  # hidden, not missing
            if denied:
                raise AuthorizationError(denied[topic])
            raise StartupError(f"topics missing on the broker: {topic} (the relay's route): "
                               f"{CREATE_IT}")

    async def close(self) -> None:
        await self._producer.stop()

    async def send(self, events: Sequence[OutboxEvent]) -> list[BaseException | None]:
        results: list[BaseException | None] = [None] * len(events)
        topics: list[str | None] = []
        for i, event in enumerate(events):
            try:
                topics.append(self.route.topic(event))
            except PermanentSendError as exc:
                results[i] = exc
                topics.append(None)
        missing, denied = await self._missing({t for t in topics if t is not None})
        lanes: dict[tuple[str, int], list[int]] = {}
        for i, (event, topic) in enumerate(zip(events, topics, strict=True)):
            if topic is None:
                continue
            if topic in denied:  # refused for good, as a denied send is below
                results[i] = PermanentSendError(denied[topic])
                continue
            try:
                if topic in missing:
                    raise TransportError(f"topic {topic} is not on the broker: {CREATE_IT}")
                partition = await self._producer.partition_for(
                    topic, event.aggregate_id.encode())
            except TransportError as exc:  # a topic denied is refused for good, as below
                results[i] = PermanentSendError(str(exc)) if _refused(exc) else exc
                continue
            lanes.setdefault((topic, partition), []).append(i)
        records = [wire_record(e) for e in events]
        await asyncio.gather(*(self._lane(topic, partition, indexes, records, results)
                               for (topic, partition), indexes in lanes.items()))
        failures = [r for r in results if r is not None]
        self._suspect = any(not isinstance(r, PermanentSendError) for r in failures)
        if failures and len(failures) == len(events) and all(
                not isinstance(r, PermanentSendError) for r in failures):
            raise TransportError(f"no event of the batch was acknowledged: {failures[0]}")
        return results

    async def _missing(self, topics: set[str]) -> tuple[set[str], dict[str, str]]:
        """The topics that fresh metadata does not list (every one when the broker cannot be
        asked), asked after a failed send or for a topic not known yet; else none, without
        asking. Those the broker denies this principal come apart, each with its line. With
        ``auto_create_topics`` only after a failed send: the broker creates the topics a send
        names."""
        if not topics or not (self._suspect or (
                not self.auto_create_topics and not topics <= self._known)):
            return set(), {}
        try:
            self._known = await self._producer.topics()
        except StartupError:
            return topics, {}
        # the topic list leaves out those the principal may not describe: denied, not missing
        denied = await self._producer.denied(topics - self._known) if (
            topics - self._known) else {}
        missing = topics - self._known - set(denied)
        for topic in sorted(missing - self._reported):  # once each: the retries log the rest
            log.error("outbox events routed to topic %s, which is not on the broker, wait "
                      "(retried with back-off): %s", topic, CREATE_IT)
        self._reported |= missing
        return missing, denied

    async def _lane(self, topic: str, partition: int, indexes: list[int],
                    records: list[_Record], results: list[BaseException | None]) -> None:
        done = 0
        while done < len(indexes):
            chunk = [records[i] for i in indexes[done:]]
            try:
                done += await self._producer.send_batch(topic, partition, chunk)
            except RecordTooLargeError as exc:
                error: BaseException = PermanentSendError(str(exc))
            except TransportError as exc:
                error = PermanentSendError(str(exc)) if _refused(exc) else exc
            else:
                continue
            first = indexes[done]
            results[first] = error
            later = TransportError(f"not sent: an earlier record of {topic}/{partition} "
                                   "failed")
            for i in indexes[done + 1:]:
                results[i] = later
            return
