"""What the ``OffsetStore`` protocol promises the consumer, checked on every store: the
broker's committed offsets (Tansu here) and the table beside the effects (PostgreSQL). A third
store is one more :class:`Subject` in :data:`SUBJECTS`."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import asyncpg
import pytest

from consumerkit import migrate
from consumerkit.offsets import KafkaOffsets, OffsetStore, PostgresOffsets
from consumerkit.testing.services import MakeTopic
from consumerkit.transport.kafka import KafkaSource
from consumerkit.transport.source import Partition

DEADLINE = 30.0  # joining a group on a real broker takes a few seconds


class Subject(Protocol):
    """Opens a store of ``group`` over ``topic`` (3 partitions); a store opened again with
    the same group is the same group's store (a restart)."""

    topic: str

    def open(self, group: str) -> AbstractAsyncContextManager[OffsetStore]: ...


class Assigned:
    """A rebalance handler that notes when the partitions came."""

    def __init__(self) -> None:
        self.came = asyncio.Event()

    async def on_assigned(self, partitions: list[Partition]) -> None:
        if partitions:
            self.came.set()

    async def on_revoked(self, partitions: list[Partition]) -> None:
        pass


class KafkaSubject:
    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap = bootstrap
        self.topic = topic

    @contextlib.asynccontextmanager
    async def open(self, group: str) -> AsyncIterator[OffsetStore]:
        assigned = Assigned()
        source = KafkaSource(topics=[self.topic], group_id=group, bootstrap=self.bootstrap,
                             options={"session_timeout_ms": 3000,
                                      "heartbeat_interval_ms": 300}, rebalance=assigned)
        await source.start()
        try:
            async with asyncio.timeout(DEADLINE):  # the broker's offsets are a member's
                while not assigned.came.is_set():
                    await source.fetch(100, 1)
            yield KafkaOffsets(source)
        finally:
            await source.stop()


class PostgresSubject:
    def __init__(self, pool: asyncpg.Pool, schema: str, topic: str) -> None:
        self.pool = pool
        self.schema = schema
        self.topic = topic

    @contextlib.asynccontextmanager
    async def open(self, group: str) -> AsyncIterator[OffsetStore]:
        yield PostgresOffsets(self.pool, self.schema, group)


SUBJECTS = ["kafka", "postgres"]


@pytest.fixture(params=SUBJECTS)
async def subject(request: pytest.FixtureRequest, kafka_bootstrap: str, make_topic: MakeTopic,
                  pg_pool: asyncpg.Pool, pg_schema: str) -> Subject:
    topic = await make_topic(partitions=3)
    if request.param == "kafka":
        return KafkaSubject(kafka_bootstrap, topic)
    async with pg_pool.acquire() as conn:
        await migrate(conn, pg_schema)
    return PostgresSubject(pg_pool, pg_schema, topic)


def group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


async def test_nothing_stored_is_left_out(subject: Subject) -> None:
    async with subject.open(group()) as store:
        assert await store.load([(subject.topic, 0), (subject.topic, 1)]) == {}


async def test_what_is_saved_is_loaded_and_other_partitions_stay_as_they_were(
        subject: Subject) -> None:
    t = subject.topic
    async with subject.open(group()) as store:
        await store.save({(t, 0): 5, (t, 2): 9})
        await store.save({(t, 0): 7})
        assert await store.load([(t, 0), (t, 1), (t, 2)]) == {(t, 0): 7, (t, 2): 9}


async def test_a_restart_loads_what_was_saved_and_groups_are_apart(subject: Subject) -> None:
    t, name = subject.topic, group()
    async with subject.open(name) as store:
        await store.save({(t, 1): 3})
    async with subject.open(name) as store:
        assert await store.load([(t, 0), (t, 1)]) == {(t, 1): 3}
    async with subject.open(group()) as other:
        assert await other.load([(t, 0), (t, 1)]) == {}


# -- the table's own promises ------------------------------------------------------------------

Open = Callable[[], PostgresOffsets]


@pytest.fixture
async def table(pg_pool: asyncpg.Pool, pg_schema: str) -> Open:
    async with pg_pool.acquire() as conn:
        await migrate(conn, pg_schema)
    return lambda: PostgresOffsets(pg_pool, pg_schema, group())


async def test_a_row_never_moves_back_unless_reset(table: Open) -> None:
    """Transactions of one partition commit out of order: a later one with a lower
    watermark leaves the row alone. A row outside the log is set back explicitly."""
    store, part = table(), ("t", 0)
    await store.save({part: 10})
    await store.save({part: 4})
    assert await store.load([part]) == {part: 10}
    async with store.pool.acquire() as conn:
        await store.write_in(conn, {part: 2}, reset=[part])
    assert await store.load([part]) == {part: 2}


async def test_an_offset_written_in_a_transaction_goes_with_it(table: Open) -> None:
    store, part = table(), ("t", 1)
    async with store.pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await store.write_in(conn, {part: 8})
        await tx.rollback()
        assert await store.load([part]) == {}
        async with conn.transaction():
            await store.write_in(conn, {part: 8})
    assert await store.load([part]) == {part: 8}


async def test_concurrent_transactions_of_the_same_partitions_do_not_deadlock(
        table: Open) -> None:
    """Rows are locked in one order whatever order the offsets come in."""
    store = table()
    parts = [("t", p) for p in range(6)]

    async def write(order: list[Partition], base: int) -> None:
        async with store.pool.acquire() as conn, conn.transaction():
            await store.write_in(conn, {p: base + i for i, p in enumerate(order)})
            await asyncio.sleep(0.05)  # both hold their first rows while asking for the rest

    await asyncio.gather(*(write(parts if n % 2 else parts[::-1], n * 10) for n in range(6)))
    assert len(await store.load(parts)) == 6


async def test_every_write_counts_one_commit_even_one_that_leaves_the_offset(
        table: Open) -> None:
    """The count is how a database that lost a commit which moved no offset is found."""
    store, part = table(), ("t", 2)
    async with store.pool.acquire() as conn:
        assert await store.write_in(conn, {part: 6}) == {part: 1}
        assert await store.write_in(conn, {part: 3}) == {part: 2}  # the offset stays
        assert await store.rows(conn, [part]) == {part: (6, 2)}
