"""``TestConsumer``: a team's handlers run by the real consumer, fed from memory.

The records come from a :class:`~consumerkit.transport.memory.MemoryBroker` instead of Kafka;
everything after the fetch is the production code path: the engine (keyed lanes, watermarks,
offset commits), the pipeline (decode, one transaction with the dedup claim and the handler,
retries, dead letters) and the PostgreSQL dedup store, against a real database.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Self

from pydantic import BaseModel

from ..consumer import Consumer
from ..deadletter.entry import DeadLetterEntry
from ..deadletter.table import DeadLetterTable
from ..deadletter.topic import DeadLetterTopic
from ..engine.pipeline import Outcome
from ..engine.runner import Engine
from ..envelope import Envelope, Record, RecordLike
from ..errors import ConfigurationError
from ..registry import HandlerSource
from ..retry import RetryPolicy
from ..settings.groups import Group, Kafka, Postgres
from ..stats import ConsumerStats
from ..transport.memory import MemoryBroker
from ..transport.source import Partition, RebalanceHandler, Source
from .encode import encode
from .observe import DeadLetterRecorder, OutcomeRecorder, Settled, observe_handlers

FAST_RETRY = RetryPolicy(max_attempts=3, initial_delay=0.01, max_delay=0.05)
"""The retry policy of a TestConsumer unless one is given: the production policy's shape,
without the seconds of back-off a test would wait through."""


class TestConsumer:
    """Run ``handlers`` as a consumer does, on events published in memory::

        async with TestConsumer([charge], postgres=Postgres(dsn=dsn, schema=schema)) as kit:
            kit.publish(OrderCreated(order_id="o-1", amount=5), key="o-1")
            await kit.drain()
            assert [s.event_id for s in kit.applied] == [...]

    ``settings`` are :class:`~consumerkit.Consumer` keyword arguments (``retry``,
    ``limits``, ``outbox``, ``dedup``, ``wire``, ...); the broker is the in-memory one, whatever
    ``kafka`` names. The offsets are kept in the
    in-memory broker (``offset_store="kafka"``) unless ``offset_store`` is given, so that
    :meth:`replay` rewinds them as an offset reset does. Dead letters go to the given
    ``dead_letter`` sinks (the dead-letter table by default) and are also kept in
    :attr:`dead_letters`. ``topics`` are created with ``partitions`` partitions each.
    """

    __test__ = False  # a helper, not a test class for pytest to collect

    def __init__(
        self, handlers: Iterable[HandlerSource], *, postgres: Postgres,
        name: str = "test-consumer",
        topics: Sequence[str] = ("events",), partitions: int = 4,
        broker: MemoryBroker | None = None, **settings: Any,
    ) -> None:
        self._recorder = DeadLetterRecorder()
        sinks = settings.pop("dead_letter", None) or DeadLetterTable()
        sinks = list(sinks) if isinstance(sinks, Sequence) else [sinks]
        settings.setdefault("retry", FAST_RETRY)
        settings.setdefault("offset_store", "kafka")
        observers = [*settings.pop("observers", ()), OutcomeRecorder(self._settle)]
        kafka = settings.pop("kafka", None) or Kafka()
        self.consumer = Consumer(
            name=name, handlers=handlers, topics=topics, postgres=postgres,
            kafka=kafka.model_copy(update={"bootstrap": "memory"}), handle_signals=False,
            dead_letter=[*sinks, self._recorder], observers=observers,
            source_factory=self._source, **settings)
        self.broker = broker or MemoryBroker()
        known = self.broker.topics()
        for topic in self.consumer.topics:
            if topic not in known:
                self.broker.create_topic(topic, partitions)
        self.errors: list[BaseException] = []  # every failure a handler raised, in order
        self._raised = 0  # errors before this index were raised by a drain, or settled
        self.settled: list[Settled] = []
        self._task: asyncio.Task[None] | None = None
        self._engine: Engine | None = None
        observe_handlers(self.consumer.routes, self.errors)

    @classmethod
    def like(cls, consumer: Consumer, **overrides: Any) -> TestConsumer:
        """A TestConsumer with ``consumer``'s name, handlers, topics, database, schema and
        settings (retry, batches, dedup, outbox, wire format, ...); ``overrides`` are
        TestConsumer arguments that replace them, a group the fields it is given alone
        (``postgres=Postgres(schema=...)`` keeps the DSN). Dead-letter topics are left out (there is
        no broker): the dead-letter table, and :attr:`dead_letters`, receive the entries."""
        routes = consumer.routes
        sinks = [s for s in consumer.dead_letter if not isinstance(s, DeadLetterTopic)]
        options = consumer.options()
        # the kit's own: a memory broker, offsets in it, no metrics server
        for own in ("kafka", "metrics", "offset_store"):
            del options[own]
        for name, group in overrides.items():  # a group's fields given replace those alone
            if isinstance(group, Group) and name in options:
                overrides[name] = options[name].merged(group)
        settings: dict[str, Any] = {
            "name": consumer.name, "topics": consumer.topics, **options,
            "dedup": consumer.dedup, "dedup_cache": consumer.dedup_cache,
            # as given: an outbox without a schema of its own follows the kit's schema
            "outbox": consumer.outbox_given, "retry": consumer.retry, "wire": consumer.wire,
            "dead_letter": sinks or None, **overrides}
        handlers = [r.func for r in (*routes.by_type.values(), *routes.by_topic.values())]
        return cls(handlers, **settings)

    # -- running --------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self, timeout: float = 30.0) -> None:
        """Start the consumer (migrating its schema) and wait until it reads."""
        self._task = asyncio.create_task(self.consumer.run(), name="consumerkit-test-consumer")
        started = asyncio.ensure_future(self.consumer.started.wait())
        await asyncio.wait({self._task, started}, timeout=timeout,
                           return_when=asyncio.FIRST_COMPLETED)
        started.cancel()
        if self._task.done():
            self._task.result()  # raises why it could not start
        if not self.consumer.started.is_set():
            await self.stop()
            raise TimeoutError(f"the consumer did not start within {timeout:g}s")

    async def stop(self) -> None:
        """Stop the consumer as a shutdown does (in-flight work finishes or is abandoned)."""
        if self._task is None:
            return
        task, self._task = self._task, None
        await self.consumer.stop()
        await asyncio.gather(task, return_exceptions=True)

    async def drain(self, *, fail_fast: bool = True, timeout: float = 30.0) -> None:
        """Wait until every record published so far is settled and its offset committed.

        With ``fail_fast`` (the default) the first exception a handler raised is raised here
        as soon as it happens, without waiting for the rest. The consumer itself is not
        stopped: it goes on in the background as in production, retrying the message by the
        retry policy and dead-lettering it if it keeps failing (see :attr:`dead_letters`
        after a later drain). With ``fail_fast=False`` this drain waits for that to end. An
        error is raised by one drain only: :attr:`errors` keeps them all.
        """
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            if fail_fast and len(self.errors) > self._raised:
                error = self.errors[self._raised]
                self._raised = len(self.errors)
                raise error
            if self._task is None:
                raise RuntimeError("the TestConsumer is not running: use `async with`")
            if self._task.done():
                self._task.result()
                raise RuntimeError("the consumer stopped")
            if self._caught_up():
                self._raised = len(self.errors)  # reported by this drain's outcomes
                return
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(
                    f"not drained within {timeout:g}s: committed {self.committed}, "
                    f"published up to {self._ends()}{self._stall()}")
            await asyncio.sleep(0.005)  # polled: settling is spread over lanes and commits

    # -- publishing -----------------------------------------------------------------------

    def publish(
        self, event: BaseModel | bytes | None, *, key: str | bytes | None = None,
        event_type: str | None = None, event_id: str | None = None,
        headers: Sequence[tuple[str, bytes | None]] = (), topic: str | None = None,
        partition: int | None = None, timestamp: datetime | int | None = None,
        occurred_at: datetime | None = None,
    ) -> Record:
        """Publish one record as a producer (an outbox relay, say) would and return it.

        A pydantic ``event`` is sent in the wire format: JSON value and the ``id`` and
        ``event_type`` headers, and ``event_version`` if its model declares one (the type
        found from the handler whose model it is, unless ``event_type`` is given; the id a
        new UUID unless ``event_id`` is given). ``bytes`` (or ``None``, a tombstone) are
        sent as they are, with ``headers`` only: a raw record.
        """
        sent: list[tuple[str, bytes | None]] = []
        value: bytes | None
        if isinstance(event, BaseModel):
            sent, value = encode(self.consumer.wire, self.consumer.routes, event,
                                 event_type=event_type, event_id=event_id,
                                 occurred_at=occurred_at)
        else:
            if event_id is not None or event_type is not None:
                raise ConfigurationError("a raw record carries its id and type in `headers`")
            value = event
        when = int(timestamp.timestamp() * 1000) if isinstance(timestamp, datetime) else timestamp
        return self.broker.append(
            topic or self.consumer.topics[0], value,
            key=key.encode() if isinstance(key, str) else key, headers=[*sent, *headers],
            timestamp=when, partition=partition)

    def redeliver(self, *records: Record) -> list[Record]:
        """Publish ``records`` again, same key, headers and value (a producer's retry, an
        outbox relay's re-publish): each is a new delivery of the same event."""
        return [self.broker.append(r.topic, r.value, key=r.key, headers=r.headers,
                                   timestamp=r.timestamp, partition=r.partition)
                for r in records]

    def replay(self, offset: int = 0, *, topic: str | None = None,
               partitions: Iterable[int] | None = None) -> None:
        """Rewind the group to ``offset`` (as an offset reset, or a crash before the commit,
        does): the consumer reads those records again from there."""
        if self.consumer.offset_store == "postgres":
            raise ConfigurationError(
                "replay() rewinds the broker's offsets, which offset_store='postgres' does not "
                "read while rows are stored: leave offset_store unset in a TestConsumer to "
                "replay")
        topic = topic or self.consumer.topics[0]
        count = self.broker.topics()[topic]
        self.broker.reset(self.consumer.name, {
            (topic, p): offset for p in (range(count) if partitions is None else partitions)})

    # -- what happened --------------------------------------------------------------------

    @property
    def applied(self) -> list[Settled]:
        """Deliveries whose handler's effects committed, in the order they settled."""
        return self._outcome(Outcome.APPLIED)

    @property
    def duplicates(self) -> list[Settled]:
        """Deliveries the dedup store recognised as already applied."""
        return self._outcome(Outcome.DUPLICATE)

    @property
    def parked(self) -> list[Settled]:
        """Deliveries held back because their key is parked (``on_exhausted="park"``)."""
        return self._outcome(Outcome.PARKED)

    @property
    def dead_letters(self) -> list[DeadLetterEntry]:
        return list(self._recorder.entries)

    @property
    def committed(self) -> dict[Partition, int]:
        """The group's committed offsets (next offset to read) per partition."""
        return self.broker.committed(self.consumer.name)

    @property
    def stats(self) -> ConsumerStats:
        return self.consumer.stats

    # -- internals ------------------------------------------------------------------------

    def _source(self, rebalance: RebalanceHandler) -> Source:
        engine = rebalance
        assert isinstance(engine, Engine)
        self._engine = engine
        return self.broker.source(topics=self.consumer.topics, group_id=self.consumer.name,
                                  rebalance=engine)

    def _settle(self, record: RecordLike, outcome: Outcome, envelope: Envelope | None) -> None:
        if envelope is not None:
            event_id: str | None = envelope.event_id
        else:  # undecodable, or known to the dedup cache before decoding
            assert self._engine is not None
            event_id = self._engine.pipeline.decoder.event_id(record)
        self.settled.append(Settled(record, outcome, event_id))

    def _stall(self) -> str:
        """Why the consumer is stalled, for a drain that timed out (see docs/failures.md)."""
        breaker = self._engine.pipeline.breaker if self._engine is not None else None
        reason = breaker.reason if breaker is not None else None
        return f"; the consumer is stalled: {reason}" if reason is not None else ""

    def _outcome(self, outcome: Outcome) -> list[Settled]:
        return [s for s in self.settled if s.outcome is outcome]

    def _ends(self) -> dict[Partition, int]:
        ends: dict[Partition, int] = {}
        for topic in self.consumer.topics:
            ends.update(self.broker.end_offsets(topic))
        return ends

    def _caught_up(self) -> bool:
        if self.broker.resetting(self.consumer.name):
            return False
        committed = self.committed
        return all(committed.get(part, 0) >= end for part, end in self._ends().items())
