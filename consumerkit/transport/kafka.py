"""The Kafka adapter: the source and the producer over aiokafka.

aiokafka's defaults are unsafe for exactly-once effects (auto-commit on, ``latest`` reset,
``acks=1``). Here: auto-commit is off and ``isolation_level="read_committed"``, and neither can
be overridden; ``auto_offset_reset`` defaults to ``"earliest"`` (a new group reads the
backlog; ``"latest"`` stays possible for whoever asks for it explicitly); producers always use
``acks="all"`` and the idempotent producer unless ``enable_idempotence=False`` is given (for
brokers without it).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    IllegalStateError,
    KafkaConnectionError,
    KafkaError,
    MessageSizeTooLargeError,
    TopicAuthorizationFailedError,
)
from aiokafka.partitioner import DefaultPartitioner

from ..envelope import RecordLike
from ..errors import ConfigurationError, RecordTooLargeError, StartupError, TransportError
from .kafka_access import (
    denied,
    hidden_topics,
    idempotence_refused,
    login_failure,
    missing_topics,
    write_denied,
)
from .kafka_skipped import SkipWatch
from .source import Partition as Partition  # re-exported: callers imported it from here
from .source import RebalanceHandler as RebalanceHandler

_log = logging.getLogger("consumerkit.consumer")

_CONSUMER_FIXED = {
    "enable_auto_commit": False,
    "isolation_level": "read_committed",
}
_CONSUMER_DEFAULTS = {
    "auto_offset_reset": "earliest",
    "max_poll_records": 500,
    "rebalance_timeout_ms": 60_000,
}
_PRODUCER_DEFAULTS: dict[str, Any] = {"enable_idempotence": True}
_PRODUCER_FIXED: dict[str, Any] = {"acks": "all"}


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, handler: RebalanceHandler) -> None:
        self.handler = handler

    async def on_partitions_revoked(self, revoked: Sequence[TopicPartition]) -> None:
        await self.handler.on_revoked([(tp.topic, tp.partition) for tp in revoked])

    async def on_partitions_assigned(self, assigned: Sequence[TopicPartition]) -> None:
        await self.handler.on_assigned([(tp.topic, tp.partition) for tp in assigned])


def consumer_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The consumer's aiokafka settings: the safe defaults, ``options``, then the fixed ones.
    Unknown names and unsafe values are refused here, before anything connects."""
    for name, value in _CONSUMER_FIXED.items():
        if name in options and options[name] != value:
            raise ConfigurationError(f"kafka option {name}={options[name]!r} is not allowed")
    _known(options, AIOKafkaConsumer, "consumer")
    merged = {**_CONSUMER_DEFAULTS, **options, **_CONSUMER_FIXED}
    for name in ("max_poll_records", "rebalance_timeout_ms"):
        if not isinstance(merged[name], int) or isinstance(merged[name], bool) or (
                merged[name] < 1):
            raise ConfigurationError(f"kafka option {name} must be a positive integer")
    return merged


def producer_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """A producer's aiokafka settings (``acks="all"`` always), checked like the consumer's."""
    if options.get("acks", "all") not in ("all", -1):
        raise ConfigurationError(f"kafka option acks={options['acks']!r} is not allowed")
    _known(options, AIOKafkaProducer, "producer")
    return {**_PRODUCER_DEFAULTS, **options, **_PRODUCER_FIXED}


def _known(options: Mapping[str, Any], client: type, what: str) -> None:
    accepted = set(inspect.signature(client).parameters)
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ConfigurationError(f"unknown Kafka {what} options: {', '.join(unknown)}")


def default_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner (murmur2, as in every Kafka client) gives
    ``key`` among ``partitions`` partitions."""
    numbers = list(range(partitions))
    return int(DefaultPartitioner()(key, numbers, numbers))


class KafkaSource:
    """A consumer-group member: subscribe, fetch batches, commit explicit offsets (the
    :class:`~consumerkit.transport.source.Source` protocol)."""

    def __init__(
        self, *, topics: Sequence[str], group_id: str, bootstrap: str,
        options: Mapping[str, Any], rebalance: RebalanceHandler,
    ) -> None:
        self.topics = list(topics)
        self.bootstrap = bootstrap
        self.group_id = group_id
        self._options = dict(options)
        self._rebalance = rebalance
        try:
            self._consumer = AIOKafkaConsumer(
                bootstrap_servers=bootstrap, group_id=group_id, **consumer_options(options))
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"invalid Kafka consumer option: {exc}") from None
        self._skips = SkipWatch()

    async def start(self) -> None:
        try:
            await self._consumer.start()
        except KafkaError as exc:
            await self._consumer.stop()
            reason = await login_failure(self.bootstrap, self._options)
            raise StartupError(
                reason or f"cannot reach the Kafka broker at {self.bootstrap}: {exc}") from exc
        try:
            missing = await missing_topics(
                self._consumer.topics, self.topics, _log,
                lambda absent: hidden_topics(self.bootstrap, absent, self._options))
        except KafkaError as exc:
            await self._consumer.stop()
            raise StartupError(f"cannot read topic metadata: {exc}") from exc
        if missing:  # the topic list leaves out those the principal may not describe
            await self._consumer.stop()
            hidden = await hidden_topics(self.bootstrap, missing, self._options)
            if hidden:
                raise denied(TopicAuthorizationFailedError(), self._options, topics=hidden)
            raise StartupError(f"topics missing on the broker: {', '.join(missing)}")
        self._skips.watch(self._consumer)  # before the subscription: no fetch has begun
        self._consumer.subscribe(topics=self.topics, listener=_Listener(self._rebalance))

    async def fetch(self, timeout_ms: int, max_records: int) -> dict[Partition, list[RecordLike]]:
        try:
            batches = await self._consumer.getmany(timeout_ms=timeout_ms,
                                                   max_records=max_records)
        except (GroupAuthorizationFailedError, TopicAuthorizationFailedError) as exc:
            raise denied(exc, self._options, group=self.group_id, topics=self.topics) from exc
        return {(tp.topic, tp.partition): records for tp, records in batches.items()}

    def skipped(self) -> dict[Partition, list[tuple[int, int]]]:
        """The control batches and aborted transactions' batches the fetches since the last
        call dropped (:mod:`~consumerkit.transport.kafka_skipped`)."""
        return self._skips.take()

    def pause(self, paused: bool) -> None:
        """Pause every assigned partition (still polling keeps the member in its group), or
        resume every paused one."""
        if paused:
            self._consumer.pause(*self._consumer.assignment())
        elif self._consumer.paused():
            self._consumer.resume(*self._consumer.paused())

    def seek(self, part: Partition, offset: int) -> None:
        # revoked since its records came: the next owner reads from the committed offset
        with contextlib.suppress(IllegalStateError):
            self._consumer.seek(TopicPartition(*part), offset)

    async def commit(self, offsets: Mapping[Partition, int]) -> None:
        """Commit ``{partition: next offset to read}``; never called with implicit offsets."""
        if not offsets:
            return
        try:
            await self._consumer.commit(
                {TopicPartition(topic, part): off for (topic, part), off in offsets.items()})
        except KafkaError as exc:
            raise TransportError(f"offset commit failed: {exc!r}") from exc

    async def end_offsets(self, parts: Sequence[Partition]) -> dict[Partition, int]:
        """The end offset (high watermark) of each of ``parts``, asked of the broker."""
        try:
            ends = await self._consumer.end_offsets([TopicPartition(*p) for p in parts])
        except KafkaError as exc:
            raise TransportError(f"cannot read end offsets: {exc!r}") from exc
        return {(tp.topic, tp.partition): off for tp, off in ends.items()}

    async def committed(self, part: Partition) -> int | None:
        """The group's committed offset of ``part`` on the broker (``None``: none yet)."""
        try:
            off = await self._consumer.committed(TopicPartition(*part))
        except KafkaError as exc:
            raise TransportError(f"cannot read the committed offset: {exc!r}") from exc
        return off if isinstance(off, int) and off >= 0 else None

    async def stop(self) -> None:
        await self._consumer.stop()


class KafkaProducer:
    """A small producer with safe settings (``acks="all"``, idempotence unless disabled)."""

    def __init__(self, bootstrap: str, options: Mapping[str, Any]) -> None:
        merged = producer_options(options)
        try:
            self._producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **merged)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"invalid Kafka producer option: {exc}") from None
        self.bootstrap = bootstrap
        self._options = dict(options)
        self.idempotent = bool(merged["enable_idempotence"] or merged.get("transactional_id"))

    async def start(self) -> None:
        try:
            await self._producer.start()
        except KafkaError as exc:
            await self._producer.stop()
            # start() bootstraps, whose every failure is a KafkaConnectionError, then (when
            # idempotent) asks for a producer id: any other error is the broker's answer
            if self.idempotent and not isinstance(exc, KafkaConnectionError):
                raise idempotence_refused(self.bootstrap, exc, self._options) from exc
            reason = await login_failure(self.bootstrap, self._options)
            raise StartupError(
                reason or f"cannot reach the Kafka broker at {self.bootstrap}: {exc}") from exc

    async def topics(self) -> set[str]:
        """Every topic the cluster knows (an all-topics metadata request creates none)."""
        try:
            cluster = await self._producer.client.fetch_all_metadata()
        except KafkaError as exc:
            raise StartupError(f"cannot read topic metadata: {exc}") from exc
        return set(cluster.topics())

    async def denied(self, topics: Collection[str]) -> dict[str, str]:
        """Of ``topics`` (absent from :meth:`topics`), those the broker denies this principal,
        each with the line naming the ACL it lacks."""
        hidden = await hidden_topics(self.bootstrap, sorted(topics), self._options)
        return {topic: write_denied(topic, self._options) for topic in hidden}

    async def send(
        self, topic: str, *, key: bytes | None, value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]],
    ) -> None:
        try:
            await self._producer.send_and_wait(topic, value=value, key=key, headers=list(headers))
        except MessageSizeTooLargeError as exc:
            raise RecordTooLargeError(f"record refused for its size: {exc}") from exc

    async def partition_for(self, topic: str, key: bytes) -> int:
        """The partition Kafka's default partitioner (murmur2, as in every Kafka client) gives
        ``key`` in ``topic``, once the topic's metadata is known."""
        try:
            partitions = sorted(await self._producer.partitions_for(topic))
        except TopicAuthorizationFailedError as exc:
            raise TransportError(write_denied(topic, self._options)) from exc
        except KafkaError as exc:
            raise TransportError(f"no metadata for topic {topic}: {exc!r}") from exc
        return int(DefaultPartitioner()(key, partitions, partitions))

    async def send_batch(
        self, topic: str, partition: int,
        records: Sequence[tuple[bytes | None, bytes | None, int | None,
                                Sequence[tuple[str, bytes]]]],
    ) -> int:
        """Send the longest prefix of ``records`` (key, value, timestamp ms, headers) that fits
        one record batch to ``partition`` and wait for the broker's acknowledgement; returns
        how many records the batch held (at least one). The broker appends a record batch
        whole or not at all. A refused batch raises :class:`TransportError` (its cause is the
        client's error, whose ``retriable`` says whether sending again can help), or
        :class:`RecordTooLargeError`."""
        batch = self._producer.create_batch()
        count = 0
        for key, value, timestamp, headers in records:
            if batch.append(key=key, value=value, timestamp=timestamp,
                            headers=list(headers)) is None:
                break
            count += 1
        batch.close()
        try:
            future = await self._producer.send_batch(batch, topic, partition=partition)
            await future
        except MessageSizeTooLargeError as exc:
            raise RecordTooLargeError(f"record batch refused for its size: {exc}") from exc
        except TopicAuthorizationFailedError as exc:
            raise TransportError(write_denied(topic, self._options)) from exc
        except KafkaError as exc:
            raise TransportError(f"send to {topic}/{partition} failed: {exc!r}") from exc
        return count

    async def stop(self) -> None:
        await self._producer.stop()
