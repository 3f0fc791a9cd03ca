"""The hand-written peers: ways of consuming the same topic, each with its own group and
schema. FastStream, consumerkit and the loops on partitioned tables live in their own modules;
``lineup`` lists them all.

Every peer decodes the same way (the ``id`` header and the pydantic model ``Amount``), reads
with the same consumer settings as consumerkit (``read_committed``, no auto-commit, polls of up
to 500 records, quick group joins) and runs until ``stop`` is set by the runner.
"""

from __future__ import annotations

import asyncio
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition

from .effects import Effect, dedup_many_sql, dedup_sql, q
from .workload import ID_HEADER, Amount, Workload

FAST_GROUP: dict[str, Any] = {  # quick joins: Tansu holds a join ~1 s at these, ~2 s at 3 s
    "session_timeout_ms": 1000,
    "heartbeat_interval_ms": 200,
    "rebalance_timeout_ms": 1000,
    "metadata_max_age_ms": 2000,
    "fetch_max_wait_ms": 20,  # Tansu answers a fetch only after this wait, data or not
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
    effect: Effect
    redis_url: str | None = None


class Peer(ABC):
    """One way of consuming. ``run`` returns after ``stop`` is set (or raises)."""

    name: ClassVar[str]
    description: ClassVar[str]
    uses_database: ClassVar[bool] = True
    dedup_table: ClassVar[str | None] = "processed"  # in the peer's schema

    @classmethod
    def unavailable(cls, redis_url: str | None) -> str | None:
        """Why this peer cannot run here (a missing API or package), else None."""
        return None

    def __init__(self, env: PeerEnv) -> None:
        self.env = env
        self.stop = asyncio.Event()
        self.count = 0
        self.began: float | None = None  # time.time() when the first message arrived
        self.ended = 0.0  # time.time() when the last message was finished
        # CPU seconds spent on the messages in a process of the peer's own, which this
        # process's CPU reading does not see (peer_before's worker)
        self.cpu_elsewhere = 0.0

    def handled(self) -> int:
        """Messages finished so far (effect committed or duplicate absorbed)."""
        return self.count

    def received(self) -> int:
        """Messages handed to the peer so far (a peer that does not stamp ``began``)."""
        return self.handled()

    def arrived(self) -> None:
        if self.began is None:
            self.began = time.time()

    def finished(self, n: int = 1) -> None:
        self.count += n
        self.ended = time.time()

    def ready(self) -> bool:
        """True once the peer's group has joined and partitions are assigned."""
        return False

    def first_seen(self) -> dict[str, float]:
        """A peer without effects: when it first decoded each key (``time.time()``)."""
        return {}

    async def prepare(self, conn: asyncpg.Connection[asyncpg.Record]) -> None:
        """Create the peer's own tables before a run (the textbook table already exists)."""
        await asyncio.sleep(0)

    async def prefill(self, conn: asyncpg.Connection[asyncpg.Record], rows: int) -> None:
        """Fill the dedup table with ``rows`` ids of earlier events (none of this workload)."""
        await conn.execute(
            f"INSERT INTO {q(self.env.schema)}.processed (event_id) "
            "SELECT 'old-' || g FROM generate_series(1, $1) AS g", rows)
        await conn.execute(f"ANALYZE {q(self.env.schema)}.processed")

    @abstractmethod
    async def run(self) -> None: ...


def group_name(*parts: str) -> str:
    """A consumer group name from ``parts``, with characters Kafka and consumerkit accept."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", ".".join(parts))


def decode(record: Any) -> tuple[str, Amount]:
    headers = dict(record.headers or ())
    return headers[ID_HEADER].decode(), Amount.model_validate_json(record.value)


class KafkaLoopPeer(Peer):
    """A hand-written aiokafka poll loop; subclasses say what a batch does."""

    consumer: AIOKafkaConsumer | None = None

    def ready(self) -> bool:
        return self.consumer is not None and bool(self.consumer.assignment())

    async def run(self) -> None:
        self.consumer = consumer = AIOKafkaConsumer(
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
                        self.arrived()
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
    dedup_table = None

    def __init__(self, env: PeerEnv) -> None:
        super().__init__(env)
        self.seen: dict[str, float] = {}

    def first_seen(self) -> dict[str, float]:
        return self.seen

    async def batch(self, consumer: AIOKafkaConsumer,
                    batches: dict[TopicPartition, Sequence[Any]]) -> None:
        now = time.time()
        for records in batches.values():
            for record in records:
                self.seen.setdefault(decode(record)[1].key, now)
        await consumer.commit({tp: records[-1].offset + 1 for tp, records in batches.items()})
        self.finished(sum(len(records) for records in batches.values()))


class TextbookPeer(KafkaLoopPeer):
    name = "textbook"
    description = ("per message: BEGIN; INSERT dedup row ON CONFLICT DO NOTHING; upsert; "
                   "COMMIT; commit that message's offset")
    per_message_commit: ClassVar[bool] = True

    async def open(self) -> None:
        self.conn: asyncpg.Connection[asyncpg.Record] = await asyncpg.connect(self.env.dsn)
        self.dedup = dedup_sql(self.env.schema)

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
                        await self.env.effect.apply(self.conn, event.key, event.amount)
                if self.per_message_commit:
                    await consumer.commit({tp: record.offset + 1})
                self.finished()
        if not self.per_message_commit:
            await consumer.commit({tp: records[-1].offset + 1 for tp, records in batches.items()})


class TextbookBatchCommitPeer(TextbookPeer):
    name = "textbook-batch-offsets"
    description = "the textbook transaction per message; offsets committed once per poll batch"
    per_message_commit = False


class TunedPeer(TextbookPeer):
    name = "tuned"
    description = ("one transaction per poll batch: per message an awaited dedup INSERT and "
                   "the effect; offsets committed after the transaction")

    async def batch(self, consumer: AIOKafkaConsumer,
                    batches: dict[TopicPartition, Sequence[Any]]) -> None:
        async with self.conn.transaction():
            for records in batches.values():
                for record in records:
                    event_id, event = decode(record)
                    if await self.claim(event_id):
                        await self.env.effect.apply(self.conn, event.key, event.amount)
        await consumer.commit({tp: records[-1].offset + 1 for tp, records in batches.items()})
        self.finished(sum(len(records) for records in batches.values()))


class SetBasedPeer(TextbookPeer):
    name = "set-based"
    description = ("one transaction per poll batch: one INSERT ... SELECT unnest(ids) ON "
                   "CONFLICT DO NOTHING RETURNING for dedup, one set-based statement for the "
                   "effects; offsets committed after the transaction")

    async def open(self) -> None:
        await super().open()
        self.dedup_many = dedup_many_sql(self.env.schema)

    async def claim_many(self, event_ids: list[str], records: list[Any]) -> set[str]:
        """Claim a batch's ids (those of its ``records``, in order) in the open transaction;
        returns the fresh ones."""
        return {r["event_id"] for r in await self.conn.fetch(self.dedup_many, event_ids)}

    async def batch(self, consumer: AIOKafkaConsumer,
                    batches: dict[TopicPartition, Sequence[Any]]) -> None:
        records = [r for batch in batches.values() for r in batch]
        decoded = [decode(r) for r in records]
        async with self.conn.transaction():
            fresh = await self.claim_many([i for i, _ in decoded], records)
            items = []
            for event_id, event in decoded:
                if event_id in fresh:  # first occurrence only: a batch may repeat an id
                    fresh.discard(event_id)
                    items.append((event.key, event.amount))
            await self.env.effect.apply_many(self.conn, items)
        await consumer.commit({tp: records[-1].offset + 1 for tp, records in batches.items()})
        self.finished(len(decoded))
