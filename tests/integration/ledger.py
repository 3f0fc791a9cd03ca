"""A checkable workload: each event carries a gap-free sequence number per key, and the
handler appends to a ledger that has NO unique constraint, so a duplicate effect shows up as
a countable extra row and an order violation as a sequence out of place."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from pydantic import BaseModel

from consumerkit import Consumer, HandlerContext, Kafka, Postgres, RetryPolicy, handler
from consumerkit.engine.runner import Engine
from consumerkit.settings.groups import Group
from consumerkit.shared.identifiers import identifier
from consumerkit.types import DbConnection

from ..brokers import IDEMPOTENCE
from ..harness.from_zero import assign_from_zero
from ..pooling import POOLER

FAST_GROUP = {  # quick joins and rebalances on the test broker (it holds a join ~session/2)
    "session_timeout_ms": 3000,
    "heartbeat_interval_ms": 300,
    "rebalance_timeout_ms": 3000,
    "metadata_max_age_ms": 2000,
}


class Step(BaseModel):
    key: str
    seq: int


@dataclass(frozen=True, slots=True)
class Event:
    event_id: str
    key: str
    seq: int
    timestamp_ms: int | None = None
    headers: tuple[tuple[str, bytes], ...] = field(default=())

    def wire_headers(self) -> list[tuple[str, bytes]]:
        base = [("id", self.event_id.encode()), ("event_type", b"step.recorded")]
        return [*base, *self.headers]


def make_events(keys: int, per_key: int, prefix: str = "evt") -> list[Event]:
    """Events interleaved across keys, each key's sequence 1..per_key in order."""
    return [Event(f"{prefix}-{k}-{s}", f"key-{k}", s)
            for s in range(1, per_key + 1) for k in range(keys)]


async def create_ledger(conn: DbConnection, schema: str) -> None:
    s = identifier(schema)
    await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
    await conn.execute(
        f"CREATE TABLE IF NOT EXISTS {s}.ledger (id bigserial PRIMARY KEY, event_id text NOT NULL,"
        " key text NOT NULL, seq int NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")


Hook = Callable[[Step, HandlerContext], Awaitable[None]]


def ledger_handler(schema: str, fail: Hook | None = None) -> Hook:
    s = identifier(schema)

    @handler("step.recorded")
    async def record_step(event: Step, ctx: HandlerContext) -> None:
        await ctx.tx.execute(
            f"INSERT INTO {s}.ledger (event_id, key, seq) VALUES ($1, $2, $3)",
            ctx.envelope.event_id, event.key, event.seq)
        if fail is not None:
            await fail(event, ctx)

    return record_step


async def publish(bootstrap: str, topic: str, events: Sequence[Event],
                  idempotence: bool = IDEMPOTENCE) -> None:
    """Send ``events`` in order; ``idempotence`` defaults to what the session's broker has."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=idempotence, linger_ms=5)
    await producer.start()
    try:
        futures = [
            await producer.send(topic, key=e.key.encode(), timestamp_ms=e.timestamp_ms,
                                headers=e.wire_headers(),
                                value=Step(key=e.key, seq=e.seq).model_dump_json().encode())
            for e in events
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def publish_raw(bootstrap: str, topic: str,
                      records: Sequence[tuple[bytes | None, bytes | None,
                                              list[tuple[str, bytes]]]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=IDEMPOTENCE)
    await producer.start()
    try:
        for key, value, headers in records:
            await producer.send_and_wait(topic, key=key, value=value, headers=headers)
    finally:
        await producer.stop()


async def ledger_rows(conn: DbConnection, schema: str) -> list[asyncpg.Record]:
    return list(await conn.fetch(
        f"SELECT event_id, key, seq FROM {identifier(schema)}.ledger ORDER BY id"))


_RUNNING: set[asyncio.Task[None]] = set()  # consumers started by Running, for wait_for


async def wait_for(check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    """Poll ``check`` until it holds; fail with ``what`` after ``timeout`` seconds, or at once
    with its error if a consumer started by :class:`Running` has died meanwhile."""
    deadline = time.monotonic() + timeout
    while not await check():
        for task in _RUNNING:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise AssertionError(f"a consumer died while waiting for {what}") from (
                    task.exception())
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


def verify(rows: Sequence[Any], expected: Sequence[Event]) -> None:
    """No lost, no duplicate, no phantom effect; per-key order kept."""
    applied = [r["event_id"] for r in rows]
    dupes = len(applied) - len(set(applied))
    assert dupes == 0, f"{dupes} duplicate effects"
    wanted = {e.event_id for e in expected}
    lost = wanted - set(applied)
    phantom = set(applied) - wanted
    assert not lost, f"{len(lost)} lost effects, e.g. {sorted(lost)[:5]}"
    assert not phantom, f"{len(phantom)} phantom effects"
    last: dict[str, int] = {}
    for r in rows:
        assert r["seq"] == last.get(r["key"], 0) + 1, (
            f"order violated on {r['key']}: {r['seq']} after {last.get(r['key'], 0)}")
        last[r["key"]] = r["seq"]


def build(name: str, schema: str, topic: str, dsn: str, bootstrap: str,
          fail: Hook | None = None, **extra: Any) -> Consumer:
    """A ledger consumer. Its group (and dedup namespace) is ``name`` + the topic, so every
    test gets fresh groups on the shared broker."""
    options = merge_options({
        "handlers": [ledger_handler(schema, fail)], "topics": [topic],
        "postgres": Postgres(dsn=dsn, schema=schema, pooler=POOLER),
        "kafka": Kafka(bootstrap=bootstrap, consumer_options=FAST_GROUP),
        "handle_signals": False,
        "retry": RetryPolicy(max_attempts=4, initial_delay=0.01, max_delay=0.05),
    }, extra)
    return Consumer(name=group(name, topic), **options)


def merge_options(defaults: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """A helper's ``Consumer`` arguments with a test's laid over them: a group the test gives
    replaces the fields it was given alone (``limits=Limits(max_batch=1)``)."""
    merged = dict(defaults)
    for name, value in extra.items():
        base = merged.get(name)
        merged[name] = base.merged(value) if isinstance(base, Group) else value
    return merged


def group(name: str, topic: str) -> str:
    return f"{name}.{topic}"


async def settled(consumer: Consumer, value: int) -> bool:
    """Whether ``value`` records have reached an outcome (applied, absorbed, parked, skipped)."""
    s = consumer.stats
    return s.applied + s.duplicates + s.dead_lettered + s.expired_skipped >= value


Read = tuple[bytes | None, list[tuple[str, bytes | None]]]


async def read_topic(bootstrap: str, topic: str, expected: int) -> list[Read]:
    """The first ``expected`` records of ``topic`` as (value, headers), within 60 s."""
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                              group_id=None)
    await reader.start()
    found: list[Read] = []
    try:
        async with asyncio.timeout(60):
            await assign_from_zero(reader, [topic])
            while len(found) < expected:
                batch = await reader.getmany(timeout_ms=200)
                for records in batch.values():
                    found.extend((r.value, list(r.headers)) for r in records)
    finally:
        await reader.stop()
    return found


class Running:
    """``async with Running(consumer):`` runs it in a task; on exit stops it and re-raises
    whatever ``run()`` raised."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Any:
        self.task = asyncio.create_task(self.consumer.run())
        _RUNNING.add(self.task)
        started = asyncio.create_task(self.consumer.started.wait())
        await asyncio.wait({self.task, started}, timeout=60,
                           return_when=asyncio.FIRST_COMPLETED)
        if self.task.done():
            started.cancel()
            _RUNNING.discard(self.task)
            self.task.result()
        assert started.done(), "consumer did not start within 60s"
        return self.consumer

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        try:
            await asyncio.wait_for(self.consumer.stop(), 60)
            await self.task
        finally:
            _RUNNING.discard(self.task)


def engine_of(consumer: Consumer) -> Engine | None:
    """The engine of ``consumer``'s run, while it runs (what the tests look into)."""
    run = consumer._run
    return run.engine if run is not None else None
