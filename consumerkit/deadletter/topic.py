"""Dead letters as Kafka records: the original key, value and headers, plus why."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ..errors import StartupError
from ..shared.identifiers import check_name
from ..transport.kafka import KafkaProducer
from ..transport.kafka_access import missing_topics
from ..types import SinkResources
from .entry import DeadLetterEntry, shown_detail

_log = logging.getLogger("consumerkit.deadletter")

REASON_HEADER = "consumerkit.reason"
DETAIL_HEADER = "consumerkit.detail"
ORIGIN_HEADER = "consumerkit.origin"
CONSUMER_HEADER = "consumerkit.consumer"
ATTEMPTS_HEADER = "consumerkit.attempts"
DETAIL_MAX_BYTES = 4000


def utf8(text: str) -> bytes:
    """``text`` as UTF-8; a lone surrogate (from a surrogate-escaped exception message, say)
    becomes its ``\\udcXX`` escape rather than an encoding error that no retry could fix."""
    return text.encode("utf-8", "backslashreplace")


def cut_utf8(text: str, limit: int = DETAIL_MAX_BYTES) -> bytes:
    """At most ``limit`` bytes of ``text`` as UTF-8, never ending inside a character, so
    consumers of the header can always decode it."""
    # A character is at most 4 bytes once encoded: cut by characters first, so a huge detail
    # is not encoded whole; then drop the partial character a byte cut may leave at the end.
    encoded = utf8(text[:limit])
    if len(encoded) <= limit:
        return encoded
    return encoded[:limit].decode("utf-8", "ignore").encode("utf-8")


class DeadLetterTopic:
    """Publishes dead letters to ``topic`` (default: ``<source topic>.dlq``).

    The record keeps the original key, value and headers and adds ``consumerkit.reason``,
    ``consumerkit.detail``, ``consumerkit.origin`` (``topic/partition/offset``),
    ``consumerkit.consumer`` and ``consumerkit.attempts``. Delivery is at least once: a crash
    after publishing but before the offset commit publishes the entry again, with the same
    origin header to deduplicate on.

    A record the producer or broker refuses for its size (above the producer's
    ``max_request_size``, 1 MiB by default, or the topic's ``max.message.bytes``) raises
    :class:`~consumerkit.errors.RecordTooLargeError`, which the writer treats as permanent.
    """

    def __init__(
        self, topic: str | None = None, *, suffix: str = ".dlq",
        producer_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.topic = check_name(topic, "dead-letter topic") if topic else None
        self.suffix = suffix
        self.producer_options = dict(producer_options or {})
        self._producer: KafkaProducer | None = None

    def destination(self, source_topic: str) -> str:
        return self.topic or f"{source_topic}{self.suffix}"

    async def open(self, resources: SinkResources) -> None:
        options = {**resources.kafka_options, **self.producer_options}
        producer = KafkaProducer(resources.kafka_bootstrap, options)
        await producer.start()
        try:
            wanted = {self.destination(topic) for topic in resources.topics}
            missing = await missing_topics(producer.topics, wanted, _log)
        except BaseException:
            await producer.stop()
            raise
        if missing:
            await producer.stop()
            raise StartupError(f"dead-letter topics missing on the broker: {', '.join(missing)}")
        self._producer = producer

    async def send(self, entry: DeadLetterEntry) -> None:
        if self._producer is None:
            raise StartupError("DeadLetterTopic used before open()")
        extra = [
            (REASON_HEADER, utf8(entry.reason)),
            (DETAIL_HEADER, cut_utf8(shown_detail(entry.detail))),
            (ORIGIN_HEADER, utf8(f"{entry.topic}/{entry.partition}/{entry.offset}")),
            (CONSUMER_HEADER, utf8(entry.consumer)),
            (ATTEMPTS_HEADER, str(entry.attempts).encode()),
        ]
        await self._producer.send(
            self.destination(entry.topic), key=entry.key, value=entry.value,
            headers=[*entry.headers, *extra])

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
