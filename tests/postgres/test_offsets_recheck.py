"""The check of stored offsets (:class:`Recheck`): a commit that races it, and its background
task at a consumer's stop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import asyncpg
import pytest
from pydantic import BaseModel

from consumerkit import HandlerContext, handler
from consumerkit.engine.decode import Decoded
from consumerkit.envelope import Envelope
from consumerkit.offsets.postgres import PostgresOffsets
from consumerkit.offsets.recheck import Recheck, Rewound
from consumerkit.offsets.state import PartitionState
from consumerkit.offsets.tracker import Tracker
from consumerkit.route_table import RouteTable
from consumerkit.stats import ConsumerStats, StatsObserver
from consumerkit.transport.source import Partition
from consumerkit.types import Claim, ClaimStatus, DbConnection

from .conftest import Connect


async def test_a_pool_closed_under_it_at_the_stop_ends_the_check_silently(
    server_dsn: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """Woken while the consumer stops (every connection the stop closes wakes it), the
    check fails: that is no database outage, and no warning says it is (each transaction
    still draining checks for itself before it applies anything)."""
    caplog.set_level(logging.DEBUG, "consumerkit.consumer")
    pool = await asyncpg.create_pool(server_dsn, min_size=1, max_size=1)
    recheck = Recheck(PostgresOffsets(pool, "consumerkit", "stopping"),
                      StatsObserver(ConsumerStats()), skip_expired=False)
    stopping = asyncio.Event()
    running = asyncio.create_task(recheck.run(pool, stopping))
    try:
        async with asyncio.timeout(30):
            while recheck.pending:  # the first check, owed from the start, is done
                await asyncio.sleep(0.01)
        stopping.set()
        await pool.close()
        recheck.lost()
        await asyncio.wait_for(running, 30)
    finally:
        running.cancel()
    assert [r.getMessage() for r in caplog.records if "stored offsets" in r.getMessage()] == []


class HeldRows(PostgresOffsets):
    """Rows whose answer, once read, is held back while ``hold`` is set, until ``release``:
    as a reply that arrives after other transactions' commits were answered."""

    hold = False

    def __init__(self, pool: asyncpg.Pool, schema: str) -> None:
        super().__init__(pool, schema, "held")
        self.read = asyncio.Event()
        self.release = asyncio.Event()

    async def rows(self, conn: DbConnection, parts: Sequence[Partition],
                   ) -> dict[Partition, tuple[int, int]]:
        found = await super().rows(conn, parts)
        if self.hold:
            self.read.set()
            await self.release.wait()
        return found


class Engine:
    """The partitions owned, and the rewinds the check asks for."""

    def __init__(self, *states: PartitionState) -> None:
        self.states = {s.partition: s for s in states}
        self.rewound: list[tuple[Partition, int]] = []

    def rewind(self, state: PartitionState, offset: int) -> None:
        self.rewound.append((state.partition, offset))


async def test_a_commit_answered_while_the_check_reads_is_no_move_back(
    server_dsn: str, connect: Connect, migrated: str,
) -> None:
    """A transaction commits its offset row while the check's read, whose snapshot came
    before, is on its way back: the row read is older than what is now confirmed, and that
    is no lost commit. A row that really went back is still found."""
    part: Partition = ("orders", 0)
    checker, writer = await connect(), await connect()
    pool = await asyncpg.create_pool(server_dsn, min_size=1, max_size=1)
    try:
        store = HeldRows(pool, migrated)
        state = PartitionState(part)
        state.offsets.confirmed(10, (await store.write_in(writer, {part: 10}))[part])
        engine = Engine(state)
        recheck = Recheck(store, StatsObserver(ConsumerStats()), skip_expired=False)
        recheck.owner = engine
        await recheck.ready(checker)  # the first check, owed from the start

        tx = writer.transaction()
        await tx.start()
        commits = (await store.write_in(writer, {part: 20}))[part]
        recheck.lost()  # a connection of the pool closed, say
        store.hold = True
        checking = asyncio.create_task(recheck.ready(checker))
        await asyncio.wait_for(store.read.wait(), 30)  # read before the commit below
        await tx.commit()
        state.offsets.confirmed(20, commits)  # as the transaction's apply does
        store.release.set()
        await asyncio.wait_for(checking, 30)
        assert engine.rewound == []

        store.hold = False  # the database loses that commit: a failover, say
        await writer.execute(f'UPDATE "{migrated}".consumer_offsets SET next_offset = 10, '
                             "commits = commits - 1")
        recheck.lost()
        await recheck.ready(checker)
        assert engine.rewound == [(part, 10)]
    finally:
        await pool.close()


class Paid(BaseModel):
    n: int


@handler("order.paid")
async def on_paid(event: Paid, ctx: HandlerContext) -> None:
    del event, ctx


def record(part: Partition, offset: int) -> Decoded:
    route = RouteTable.build([on_paid]).by_type["order.paid"]
    env = Envelope(f"e-{offset}", "header", "order.paid", "k", part[0], part[1], offset, None)
    return Decoded(env, route, Paid(n=offset))


async def test_a_row_that_went_back_unseen_rolls_the_transaction_back_and_owes_a_check(
    server_dsn: str, connect: Connect, migrated: str,
) -> None:
    """Behind a transaction pooler a failover closes no connection of an idle client: no check
    is owed, and the next transaction would go on from the consumer's memory, past records
    whose effects the database lost. The row it writes counts fewer commits than were
    answered: the transaction stops there (its records are read again), owing the check,
    which reads the partition again from the row."""
    part: Partition = ("orders", 0)
    conn = await connect()
    pool = await asyncpg.create_pool(server_dsn, min_size=1, max_size=1)
    try:
        store = PostgresOffsets(pool, migrated, "unseen")
        state = PartitionState(part)
        for offset in (10, 20):
            state.offsets.started(offset - 1)
            state.offsets.finished(offset - 1)
            state.offsets.confirmed(offset, (await store.write_in(conn, {part: offset}))[part])
        engine = Engine(state)
        recheck = Recheck(store, StatsObserver(ConsumerStats()), skip_expired=False)
        recheck.owner = engine
        await recheck.ready(conn)  # the first check, owed from the start
        # the database loses the last commit, and no connection closes
        await conn.execute(f'UPDATE "{migrated}".consumer_offsets SET next_offset = 10, '
                           "commits = commits - 1")
        state.offsets.started(20)
        with pytest.raises(Rewound):
            async with conn.transaction():
                await recheck.write(conn, [record(part, 20)], [Claim(ClaimStatus.CLAIMED)])
        assert await store.rows(conn, [part]) == {part: (10, 1)}  # rolled back
        assert recheck.pending
        await recheck.ready(conn)
        assert engine.rewound == [(part, 10)]
    finally:
        await pool.close()


async def test_a_new_timeline_owes_a_check_without_a_connection_closing(
    server_dsn: str,
) -> None:
    """A partition with nothing more to apply writes no row to find a failover by: behind a
    transaction pooler the background task reads the timeline every ``poll`` seconds, and
    one other than the last check's owes a check (here the one remembered is made older, as
    a promotion makes the database's newer)."""
    pool = await asyncpg.create_pool(server_dsn, min_size=1, max_size=1)
    recheck = Recheck(PostgresOffsets(pool, "consumerkit", "timeline"),
                      StatsObserver(ConsumerStats()), skip_expired=False, poll=0.05)
    stopping = asyncio.Event()
    running = asyncio.create_task(recheck.run(pool, stopping))
    try:
        async with asyncio.timeout(30):
            while recheck.pending:  # the first check, owed from the start, is done
                await asyncio.sleep(0.01)
            now = recheck.epoch
            recheck.epoch = "00000000"  # the timeline before a promotion
            while recheck.epoch != now:  # checked again, on the current timeline
                await asyncio.sleep(0.01)
    finally:
        stopping.set()
        recheck.lost()
        await asyncio.wait_for(running, 30)
        await pool.close()


async def test_the_committer_stores_no_watermark_on_a_row_that_went_back_unseen(
    server_dsn: str, connect: Connect, migrated: str,
) -> None:
    """The committer stores the watermarks from memory: on a row that went back with no
    connection closing, it would store one past records whose effects the database lost,
    and the check would read the partition again from there. It rolls back, owing the
    check."""
    part: Partition = ("orders", 0)
    conn = await connect()
    pool = await asyncpg.create_pool(server_dsn, min_size=1, max_size=1)
    try:
        store = PostgresOffsets(pool, migrated, "committer")
        state = PartitionState(part)
        for offset in (10, 20):
            state.offsets.confirmed(offset, (await store.write_in(conn, {part: offset}))[part])
        recheck = Recheck(store, StatsObserver(ConsumerStats()), skip_expired=False)
        recheck.owner = Engine(state)
        await recheck.ready(conn)  # the first check, owed from the start
        await conn.execute(f'UPDATE "{migrated}".consumer_offsets SET next_offset = 10, '
                           "commits = commits - 1")
        for offset in range(20, 30):  # applied on the database before it went back
            state.offsets.started(offset)
            state.offsets.finished(offset)
        tracker = Tracker({part: state}, ConsumerStats())
        tracker.database, tracker.recheck = store, recheck
        with pytest.raises(Rewound):
            await tracker._store([state])
        assert await store.rows(conn, [part]) == {part: (10, 1)}  # not 30
        assert recheck.pending
    finally:
        await pool.close()
