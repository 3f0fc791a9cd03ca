"""The peers: ways of consuming the same topic, each with its own group and schema.

Every peer decodes the same way (the ``id`` header and the pydantic model ``Amount``), reads
with the same consumer settings as consumerkit (``read_committed``, no auto-commit, polls of up
to 500 records, quick group joins) and runs until ``stop`` is set by the runner.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition

from consumerkit import Consumer, HandlerContext, handler

from .effects import dedup_sql, upsert_sql
from .workload import EVENT_TYPE, ID_HEADER, Amount, Workload

FAST_GROUP: dict[str, Any] = {  # quick joins on Tansu (it holds a join ~session/2)
    "session_timeout_ms": 3000,
    "heartbeat_interval_ms": 300,
    "rebalance_timeout_ms": 3000,
    "metadata_max_age_ms": 2000,
}
POLL_RECORDS = 500


@dataclass(frozen=True, slots=True)
class PeerEnv:
    dsn: str
    bootstrap: str
    topic: str
    group: str
    schema: str
    workload: Workload


class Peer(ABC):
    """One way of consuming. ``run`` returns after ``stop`` is set (or raises)."""

    name: ClassVar[str]
    description: ClassVar[str]
    uses_database: ClassVar[bool] = True

    def __init__(self, env: PeerEnv) -> None:
        self.env = env
        self.stop = asyncio.Event()
        self.count = 0

    def handled(self) -> int:
        """Messages finished so far (effect committed or duplicate absorbed)."""
        return self.count

    def elapsed(self) -> float:
        """The measured window of a peer without a database (seconds)."""
        raise NotImplementedError

    @abstractmethod
    async def run(self) -> None: ...


def decode(record: Any) -> tuple[str, Amount]:
    headers = dict(record.headers or ())
    return headers[ID_HEADER].decode(), Amount.model_validate_json(record.value)


class KafkaLoopPeer(Peer):
    """A hand-written aiokafka poll loop; subclasses say what a batch does."""

    async def run(self) -> None:
        consumer = AIOKafkaConsumer(
            self.env.topic, bootstrap_servers=self.env.bootstrap, group_id=self.env.group,
            enable_auto_commit=False, auto_offset_reset="earliest",
            isolation_level="read_committed", max_poll_records=POLL_RECORDS, **FAST_GROUP)
        await consumer.start()
        try:
            await self.open()
            try:
                while not self.stop.is_set():
                    batches = await consumer.getmany(timeout_ms=100, max_records=POLL_RECORDS)
                    if batches:
                        await self.batch(consumer, batches)
            finally:
                await self.close()
        finally:
            await consumer.stop()

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    @abstractmethod
    async def batch(self, consumer: AIOKafkaConsumer,
                    batches: dict[TopicPartition, Sequence[Any]]) -> None: ...


class RawPeer(KafkaLoopPeer):
    name = "raw"
    description = "aiokafka consume + decode + explicit offset commit per poll batch, no database"
    uses_database = False

    def __init__(self, env: PeerEnv) -> None:
        super().__init__(env)
        self.first: float | None = None
        self.last = 0.0

    async def batch(self, consumer: AIOKafkaConsumer,
                    batches: dict[TopicPartition, Sequence[Any]]) -> None:
        if self.first is None:
            self.first = time.perf_counter()
        for records in batches.values():
            for record in records:
                decode(record)
        await consumer.commit({tp: records[-1].offset + 1 for tp, records in batches.items()})
        self.count += sum(len(records) for records in batches.values())
        self.last = time.perf_counter()

    def elapsed(self) -> float:
        return self.last - self.first if self.first is not None else 0.0


class TextbookPeer(KafkaLoopPeer):
    name = "textbook"
    description = ("per message: BEGIN; INSERT dedup row ON CONFLICT DO NOTHING; upsert; "
                   "COMMIT; commit that message's offset")
    per_message_commit: ClassVar[bool] = True

    async def open(self) -> None:
        self.conn: asyncpg.Connection[asyncpg.Record] = await asyncpg.connect(self.env.dsn)
        self.dedup = dedup_sql(self.env.schema)
        self.upsert = upsert_sql(self.env.schema)

    async def close(self) -> None:
        await self.conn.close()

    async def claim(self, event_id: str) -> bool:
        """Insert the dedup row; True when the event is new."""
        return await self.conn.execute(self.dedup, event_id) == "INSERT 0 1"

    async def batch(self, consumer: AIOKafkaConsumer,
                    batches: dict[TopicPartition, Sequence[Any]]) -> None:
        for tp, records in batches.items():
            for record in records:
                if self.stop.is_set():
                    return
                event_id, event = decode(record)
                async with self.conn.transaction():
                    if await self.claim(event_id):
                        await self.conn.execute(self.upsert, event.key, event.amount)
                if self.per_message_commit:
                    await consumer.commit({tp: record.offset + 1})
                self.count += 1
        if not self.per_message_commit:
            await consumer.commit({tp: records[-1].offset + 1 for tp, records in batches.items()})


class TextbookBatchCommitPeer(TextbookPeer):
    name = "textbook-batch-offsets"
    description = "the textbook transaction per message; offsets committed once per poll batch"
    per_message_commit = False


Handler = Callable[[Amount, HandlerContext], Awaitable[None]]


def effect_handler(schema: str) -> Handler:
    sql = upsert_sql(schema)

    @handler(EVENT_TYPE)
    async def apply_amount(event: Amount, ctx: HandlerContext) -> None:
        await ctx.tx.execute(sql, event.key, event.amount)

    return apply_amount


class ConsumerkitPeer(Peer):
    name = "consumerkit"
    description = "consumerkit.Consumer with default settings, the upsert in a handler"

    def __init__(self, env: PeerEnv) -> None:
        super().__init__(env)
        self.consumer = Consumer(
            name=env.group, handlers=[effect_handler(env.schema)], topics=[env.topic],
            kafka_bootstrap=env.bootstrap, postgres_dsn=env.dsn, schema=env.schema,
            handle_signals=False, kafka_consumer_options=FAST_GROUP)

    def handled(self) -> int:
        s = self.consumer.stats
        return s.applied + s.duplicates + s.dead_lettered + s.expired_skipped

    async def run(self) -> None:
        task = asyncio.create_task(self.consumer.run())
        stop = asyncio.create_task(self.stop.wait())
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not task.done():
            await self.consumer.stop()
        await task


PEERS: dict[str, type[Peer]] = {
    p.name: p for p in (RawPeer, TextbookPeer, TextbookBatchCommitPeer, ConsumerkitPeer)}
