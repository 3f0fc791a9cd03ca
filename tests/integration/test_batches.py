"""The batch engine on a real PostgreSQL: many records in one transaction, the fallback one by
one, failures attributed to the right record, cancellation, and the stats invariant.

The pipeline and the batcher are driven directly (records built in memory), so each case is
deterministic; the end-to-end runs with a broker live in ``test_exactly_once``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import asyncpg
import pytest
from pydantic import BaseModel

from consumerkit import HandlerContext, Limits, RetryPolicy, handler, migrate
from consumerkit.deadletter.entry import DeadLetterEntry
from consumerkit.deadletter.writer import DeadLetterWriter
from consumerkit.dedup import PostgresDedupStore
from consumerkit.engine.batch import Batcher
from consumerkit.engine.decode import Decoded, Decoder
from consumerkit.engine.fetch import fetch_records
from consumerkit.engine.pipeline import Outcome, Pipeline
from consumerkit.engine.runner import Engine
from consumerkit.envelope import Record, RecordLike, WireFormat
from consumerkit.offsets.state import PartitionState
from consumerkit.route_table import RouteTable
from consumerkit.shared.identifiers import identifier
from consumerkit.stats import ConsumerStats
from consumerkit.transport.kafka import Partition
from consumerkit.transport.memory import MemoryBroker
from consumerkit.types import Claim, DbConnection, DedupCache

from .conftest import LedgerTopic
from .ledger import (
    Running,
    build,
    create_ledger,
    group,
    ledger_rows,
    make_events,
    publish,
    publish_raw,
    settled,
    verify,
    wait_for,
)
from .ledger import Step as LedgerStep
from .test_exactly_once import committed_total

TOPIC = "orders"
DAY_MS = 86_400_000


class Step(BaseModel):
    key: str
    seq: int


class ListSink:
    """A dead-letter sink that keeps what it is sent."""

    def __init__(self) -> None:
        self.entries: list[DeadLetterEntry] = []

    async def open(self, resources: object) -> None:
        pass

    async def send(self, entry: DeadLetterEntry) -> None:
        self.entries.append(entry)

    async def close(self) -> None:
        pass


Hook = Callable[[Step, HandlerContext], Awaitable[bool | None]]
"""Runs before the ledger insert; returning True skips the insert."""


@dataclass
class Bench:
    """A pipeline and a batcher over a fresh schema, with a ledger handler whose behaviour
    per event id can be changed through ``hooks``."""

    pool: asyncpg.Pool
    schema: str
    pipeline: Pipeline
    batcher: Batcher
    sink: ListSink
    hooks: dict[str, Hook] = field(default_factory=dict)
    reports: list[tuple[int, Outcome]] = field(default_factory=list)

    def report(self, record: RecordLike, outcome: Outcome) -> None:
        self.reports.append((record.offset, outcome))

    async def ledger(self) -> list[str]:
        rows = await self.pool.fetch(
            f"SELECT event_id FROM {identifier(self.schema)}.ledger ORDER BY id")
        return [r["event_id"] for r in rows]

    def invariant(self) -> tuple[int, int]:
        s = self.pipeline.stats
        return s.delivered, (s.applied + s.duplicates + s.dead_lettered + s.expired_skipped
                             + s.abandoned)


_offsets = iter(range(1_000_000))


def rec(event_id: str, key: str = "k", seq: int = 1, *, partition: int = 0,
        timestamp_ms: int | None = None, value: bytes | None = None) -> Record:
    payload = value if value is not None else Step(key=key, seq=seq).model_dump_json().encode()
    return Record(TOPIC, partition, next(_offsets), key.encode(), payload,
                  [("id", event_id.encode()), ("event_type", b"step.recorded")],
                  timestamp_ms if timestamp_ms is not None else int(time.time() * 1000))


@pytest.fixture
async def bench_factory(pg_pool: asyncpg.Pool, pg_schema: str
                        ) -> AsyncIterator[Callable[..., Awaitable[Bench]]]:
    async with pg_pool.acquire() as conn:
        await migrate(conn, pg_schema)
        await create_ledger(conn, pg_schema)
    made: list[Bench] = []

    async def make(*, max_batch: int = 100, concurrency: int = 4, max_attempts: int = 3,
                   handler_timeout: float | None = 30.0, cache: DedupCache | None = None,
                   ) -> Bench:
        s = identifier(pg_schema)
        hooks: dict[str, Hook] = {}

        @handler("step.recorded")
        async def record_step(event: Step, ctx: HandlerContext) -> None:
            hook = hooks.get(ctx.envelope.event_id)
            if hook is not None and await hook(event, ctx):
                return
            await ctx.tx.execute(
                f"INSERT INTO {s}.ledger (event_id, key, seq) VALUES ($1, $2, $3)",
                ctx.envelope.event_id, event.key, event.seq)

        sink = ListSink()
        name = f"batches-{uuid.uuid4().hex[:8]}"
        pipeline = Pipeline(
            consumer=name, namespace=name, pool=pg_pool, dedup=PostgresDedupStore(pg_schema),
            decoder=Decoder(RouteTable.build([record_step]), WireFormat(), 1 << 20),
            retry=RetryPolicy(max_attempts=max_attempts, initial_delay=0.01, max_delay=0.02),
            dead_letters=DeadLetterWriter([sink]), expired="dead_letter",
            stats=ConsumerStats(), concurrency=concurrency, handler_timeout=handler_timeout,
            cache=cache)
        bench = Bench(pg_pool, pg_schema, pipeline, Batcher(pipeline, max_batch), sink, hooks)
        made.append(bench)
        return bench

    yield make
    for bench in made:
        await bench.batcher.close()


Factory = Callable[..., Awaitable[Bench]]


async def process(bench: Bench, *groups: Sequence[Record],
                  abandon: asyncio.Event | None = None) -> None:
    """Hand ``groups`` (one lane each) to the batcher at once: they share a batch."""
    flag = abandon or asyncio.Event()
    await asyncio.wait_for(asyncio.gather(
        *(bench.batcher.process(group, flag, bench.report) for group in groups)), 30)


async def until(check: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


# -- attribution of a batch's failure ------------------------------------------------------


async def test_a_swallowed_database_error_is_not_blamed_on_the_next_handler(
    bench_factory: Factory,
) -> None:
    """A handler that swallows a database error leaves the batch's transaction aborted; the
    next handler's first statement then fails. That record did nothing wrong: it must not be
    charged an attempt (with one attempt allowed, it would be dead-lettered unrun)."""
    bench = await bench_factory(max_attempts=1)

    async def swallow(event: Step, ctx: HandlerContext) -> bool:
        with contextlib.suppress(asyncpg.DivisionByZeroError):
            await ctx.tx.execute("SELECT 1/0")
        return True  # returns as if all went well

    bench.hooks["swallower"] = swallow
    await process(bench, [rec("swallower", "a")], [rec("innocent", "b")])
    assert await bench.ledger() == ["innocent"]
    assert [e.event_id for e in bench.sink.entries] == ["swallower"]
    assert bench.pipeline.stats.applied == 1
    assert bench.pipeline.stats.batch_fallbacks == 1


async def test_a_connection_lost_under_a_batch_is_an_outage_not_the_handlers_failure(
    bench_factory: Factory, pg_pool: asyncpg.Pool,
) -> None:
    """The batch's connection dies while a handler waits (terminated while idle in the
    transaction). Alone, such a record is retried as an outage; in a batch it must not be
    charged an attempt either."""
    bench = await bench_factory(max_attempts=1)
    waiting = asyncio.Event()
    go = asyncio.Event()
    pids: list[int] = []

    async def stall(event: Step, ctx: HandlerContext) -> None:
        if not pids:  # only the first run
            pids.append(ctx.tx.get_server_pid())
            waiting.set()
            await go.wait()

    bench.hooks["victim"] = stall
    task = asyncio.create_task(process(bench, [rec("first", "a")], [rec("victim", "b")]))
    await asyncio.wait_for(waiting.wait(), 10)
    await pg_pool.execute("SELECT pg_terminate_backend($1)", pids[0])
    for _ in range(500):
        if not await pg_pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pids[0]):
            break
        await asyncio.sleep(0.01)
    go.set()
    await task
    assert sorted(await bench.ledger()) == ["first", "victim"]
    assert bench.sink.entries == []
    assert bench.pipeline.stats.applied == 2


async def test_a_batch_whose_connection_the_client_saw_close_blames_no_record(
    bench_factory: Factory, pg_pool: asyncpg.Pool,
) -> None:
    """As above, but the handler returns only once the client has noticed the connection is
    gone: the transaction state it then reports means nothing, and the record must not be
    blamed for ending the transaction (nor charged its one attempt)."""
    bench = await bench_factory(max_attempts=1)
    waiting = asyncio.Event()
    txs: list[DbConnection] = []

    async def stall(event: Step, ctx: HandlerContext) -> None:
        if not txs:  # only the first run
            txs.append(ctx.tx)
            waiting.set()
            await until(lambda: txs[0].is_closed(), "the client to see the connection close")

    bench.hooks["victim"] = stall
    task = asyncio.create_task(process(bench, [rec("first", "a")], [rec("victim", "b")]))
    await asyncio.wait_for(waiting.wait(), 10)
    await pg_pool.execute("SELECT pg_terminate_backend($1)", txs[0].get_server_pid())
    await task
    assert sorted(await bench.ledger()) == ["first", "victim"]
    assert bench.sink.entries == []
    assert bench.pipeline.stats.applied == 2


# -- accounting ----------------------------------------------------------------------------


async def test_records_dropped_from_an_abandoned_batch_count_as_abandoned(
    bench_factory: Factory,
) -> None:
    """A group abandoned before its batch ran is neither applied nor reported: each of its
    records counts as abandoned, so delivered == outcomes + abandoned."""
    bench = await bench_factory(concurrency=1)
    slots = bench.pipeline.slots
    await slots.acquire()  # the batcher cannot start a batch
    abandon = asyncio.Event()
    lane = asyncio.create_task(bench.batcher.process(
        [rec("x-1"), rec("x-2"), rec("x-3")], abandon, bench.report))
    await until(lambda: bool(bench.batcher._pending), "the group to be queued")
    abandon.set()
    slots.release()
    await asyncio.wait_for(lane, 10)
    assert bench.reports == []
    assert await bench.ledger() == []
    assert bench.invariant() == (3, 3)
    assert bench.pipeline.stats.abandoned == 3


# -- a lane cut short while its batch commits ------------------------------------------------


def _engine(pipeline: Pipeline, max_batch: int = 100) -> Engine:
    return Engine(pipeline=pipeline, max_in_flight=100, batch_size=100, max_batch=max_batch,
                  revoke_timeout=1.0, keepalive=10.0, stats=pipeline.stats)


async def test_a_lane_killed_while_its_batch_commits_leaves_its_offsets_and_finds_duplicates(
    bench_factory: Factory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Revocation kills a lane whose batch has committed in the database but not yet answered
    (the kill cancels the batch too late to roll it back). The killed lane's records are applied
    but not reported, so their offsets stay uncommitted and the new owner's redelivery finds
    them as duplicates; the other lane's record, applied again alone, is a duplicate as well.
    Every delivered record is accounted for."""
    bench = await bench_factory()
    pipeline = bench.pipeline
    engine = _engine(pipeline)
    engine.batcher = bench.batcher
    committed = asyncio.Event()
    original = pipeline.apply_batch

    async def slow_answer(items: list[Decoded]) -> list[Claim]:
        claims = await original(items)
        committed.set()
        await asyncio.Event().wait()  # the answer to COMMIT never comes
        return claims

    monkeypatch.setattr(pipeline, "apply_batch", slow_answer)
    part: Partition = (TOPIC, 0)
    state = engine.states[part] = PartitionState(part)
    revoked = [rec("r-1", "a"), rec("r-2", "a"), rec("r-3", "a")]
    other_part: Partition = (TOPIC, 1)
    other = engine.states[other_part] = PartitionState(other_part)
    kept = [rec("o-1", "b", partition=1)]
    engine._dispatch(part, revoked, engine.states[part])
    engine._dispatch(other_part, kept, engine.states[other_part])
    await asyncio.wait_for(committed.wait(), 10)
    monkeypatch.setattr(pipeline, "apply_batch", original)

    state.abandon.set()
    state.kill()
    await asyncio.wait_for(state.drained.wait(), 10)
    # nothing of the killed group is finished: the commit stays at its first record
    assert state.offsets.committable() == revoked[0].offset
    await asyncio.wait_for(other.drained.wait(), 10)
    assert other.offsets.committable() == kept[0].offset + 1
    await asyncio.wait_for(engine.lanes.join(), 10)
    assert await bench.ledger() == ["r-1", "r-2", "r-3", "o-1"]
    stats = pipeline.stats
    assert (stats.applied, stats.duplicates, stats.abandoned) == (0, 1, 3)
    assert bench.invariant() == (4, 4)

    # the new owner reads the revoked records again: all duplicates, nothing applied twice
    fresh = PartitionState(part)
    engine.states[part] = fresh
    engine._dispatch(part, revoked, engine.states[part])
    await asyncio.wait_for(engine.lanes.join(), 10)
    assert stats.duplicates == 4
    assert fresh.offsets.committable() == revoked[-1].offset + 1
    assert await bench.ledger() == ["r-1", "r-2", "r-3", "o-1"]
    assert bench.invariant() == (7, 7)


class SetCache:
    """A dedup cache in a set: what it was told after commits, and how often it was asked."""

    def __init__(self, *known: str) -> None:
        self.ids = set(known)
        self.asked: list[str] = []
        self.on_lookup: Callable[[int, int, int], None] | None = None

    def check(self, policy: object) -> None:
        pass

    async def open(self) -> None:
        pass

    async def known(self, namespace: str, event_ids: Sequence[str]) -> set[str]:
        self.asked.extend(event_ids)
        return self.ids & set(event_ids)

    async def remember(self, namespace: str, event_ids: Sequence[str]) -> None:
        self.ids.update(event_ids)

    async def close(self) -> None:
        pass


async def test_cache_hits_of_a_batch_that_fell_back_are_counted_once(
    bench_factory: Factory,
) -> None:
    cache = SetCache("seen-before")
    bench = await bench_factory(cache=cache)
    failed: list[str] = []

    async def fail_once(event: Step, ctx: HandlerContext) -> None:
        if not failed:
            failed.append(ctx.envelope.event_id)
            raise RuntimeError("first run fails")

    bench.hooks["flaky"] = fail_once
    await process(bench, [rec("seen-before", "a"), rec("fresh", "a")], [rec("flaky", "b")])
    stats = bench.pipeline.stats
    assert stats.batch_fallbacks == 1
    assert (stats.cache_hits, stats.duplicates, stats.applied) == (1, 1, 2)
    assert sorted(await bench.ledger()) == ["flaky", "fresh"]
    assert {"fresh", "flaky"} <= cache.ids  # told after their commits
    assert bench.invariant() == (3, 3)


async def test_a_shutdown_with_a_handler_hung_in_a_batch_ends_and_accounts_for_everything(
    bench_factory: Factory,
) -> None:
    """drain: the lanes are cancelled after the shutdown wait, the batch holding a hung
    handler rolls back, nothing is committed past what was applied, and every delivered record
    is accounted for."""
    bench = await bench_factory(handler_timeout=None)
    engine = _engine(bench.pipeline)
    engine.batcher = bench.batcher
    inside = asyncio.Event()

    async def hang(event: Step, ctx: HandlerContext) -> None:
        inside.set()
        await asyncio.Event().wait()

    bench.hooks["s-2"] = hang
    part: Partition = (TOPIC, 0)
    state = engine.states[part] = PartitionState(part)
    records = [rec("s-1", "a"), rec("s-2", "b"), rec("s-3", "c")]
    engine._dispatch(part, records[:1], engine.states[part])
    await asyncio.wait_for(engine.lanes.join(), 10)  # s-1 applied on its own
    engine._dispatch(part, records[1:], engine.states[part])
    await asyncio.wait_for(inside.wait(), 10)
    await asyncio.wait_for(engine.drain(0.2, asyncio.Event()), 10)
    assert await bench.ledger() == ["s-1"]
    assert state.offsets.committable() == records[1].offset
    assert engine.in_flight == 0
    assert bench.invariant() == (3, 3)
    assert bench.pipeline.stats.abandoned == 2
    assert bench.pipeline.stats.batch_fallbacks == 0  # nobody was left to fall back


# -- COMMIT without its answer ----------------------------------------------------------------


async def test_a_commit_whose_answer_is_lost_falls_back_and_finds_duplicates(
    bench_factory: Factory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The batch's COMMIT succeeds in the database but the connection dies before the reply
    (simulated: the batch raises a connection error after committing). The fallback applies
    the records one by one and each claim finds the committed row: nothing twice."""
    bench = await bench_factory()
    pipeline = bench.pipeline
    original = pipeline.apply_batch

    async def committed_then_lost(items: list[Decoded]) -> list[Claim]:
        await original(items)
        raise ConnectionResetError("connection lost while waiting for COMMIT's answer")

    monkeypatch.setattr(pipeline, "apply_batch", committed_then_lost)
    await process(bench, [rec("c-1", "a"), rec("c-2", "a")], [rec("c-3", "b")])
    assert sorted(await bench.ledger()) == ["c-1", "c-2", "c-3"]
    assert pipeline.stats.duplicates == 3
    assert pipeline.stats.batch_fallbacks == 1
    assert bench.invariant() == (3, 3)
    assert bench.sink.entries == []


async def test_a_commit_refused_by_a_deferred_constraint_parks_only_its_record(
    bench_factory: Factory, pg_pool: asyncpg.Pool, pg_schema: str,
) -> None:
    """A deferred constraint fails at the batch's COMMIT: no handler raised, so no record is
    blamed; one by one, only the record that broke it fails (at its own COMMIT)."""
    bench = await bench_factory(max_attempts=2)
    s = identifier(pg_schema)
    await pg_pool.execute(f"CREATE TABLE {s}.parent (id int PRIMARY KEY)")
    await pg_pool.execute(
        f"CREATE TABLE {s}.child (parent int REFERENCES {s}.parent DEFERRABLE INITIALLY DEFERRED)")

    async def orphan(event: Step, ctx: HandlerContext) -> None:
        await ctx.tx.execute(f"INSERT INTO {s}.child VALUES (42)")

    bench.hooks["f-1"] = orphan
    await process(bench, [rec("f-0", "a"), rec("f-1", "a"), rec("f-2", "a")],
                  [rec("f-3", "b")])
    assert sorted(await bench.ledger()) == ["f-0", "f-2", "f-3"]
    assert [(e.event_id, e.attempts) for e in bench.sink.entries] == [("f-1", 2)]
    assert bench.pipeline.stats.batch_fallbacks == 1
    assert bench.invariant() == (4, 4)


# -- same id twice, expired, undecodable ------------------------------------------------------


async def test_the_same_event_twice_in_one_batch_is_applied_once(bench_factory: Factory
                                                                  ) -> None:
    bench = await bench_factory()
    await process(bench, [rec("d-1", "a", 1), rec("d-1", "a", 1), rec("d-2", "a", 2)],
                  [rec("d-2", "b", 2), rec("d-3", "b", 3)])
    assert sorted(await bench.ledger()) == ["d-1", "d-2", "d-3"]
    assert (bench.pipeline.stats.applied, bench.pipeline.stats.duplicates) == (3, 2)
    assert bench.invariant() == (5, 5)


async def test_expired_and_undecodable_records_in_a_group_are_dead_lettered_around_the_rest(
    bench_factory: Factory,
) -> None:
    bench = await bench_factory()
    old = int(time.time() * 1000) - 400 * DAY_MS
    group = [rec("e-1", "a", 1), rec("e-2", "a", 2, timestamp_ms=old),
             rec("e-3", "a", 3, value=b"{not json"), rec("e-4", "a", 4)]
    await process(bench, group)
    assert await bench.ledger() == ["e-1", "e-4"]
    assert sorted((e.event_id, e.reason) for e in bench.sink.entries) == [
        ("e-2", "expired"), ("e-3", "invalid_json")]
    assert {offset for offset, _ in bench.reports} == {r.offset for r in group}
    assert bench.invariant() == (4, 4)


# -- handlers that misbehave inside a batch ---------------------------------------------------


async def test_a_handler_using_a_savepoint_inside_a_batch(bench_factory: Factory) -> None:
    bench = await bench_factory()

    async def savepoint(event: Step, ctx: HandlerContext) -> None:
        try:
            async with ctx.tx.transaction():
                await ctx.tx.execute("SELECT 1/0")
        except asyncpg.DivisionByZeroError:
            pass  # rolled back to the savepoint: the transaction is fine

    bench.hooks["s-1"] = savepoint
    await process(bench, [rec("s-0", "a"), rec("s-1", "a")], [rec("s-2", "b")])
    assert sorted(await bench.ledger()) == ["s-0", "s-1", "s-2"]
    assert bench.pipeline.stats.batch_fallbacks == 0


async def test_a_handler_raising_cancelled_error_itself_fails_only_its_record(
    bench_factory: Factory,
) -> None:
    bench = await bench_factory(max_attempts=2)

    async def cancel(event: Step, ctx: HandlerContext) -> None:
        raise asyncio.CancelledError()

    bench.hooks["z-1"] = cancel
    await process(bench, [rec("z-0", "a"), rec("z-1", "a"), rec("z-2", "a")],
                  [rec("z-3", "b")])
    assert sorted(await bench.ledger()) == ["z-0", "z-2", "z-3"]
    assert [e.event_id for e in bench.sink.entries] == ["z-1"]
    assert bench.sink.entries[0].attempts == 2  # the batch's run was its first attempt
    assert bench.invariant() == (4, 4)


async def test_a_handler_that_rolls_back_the_batch_costs_the_others_nothing(
    bench_factory: Factory,
) -> None:
    bench = await bench_factory()

    async def rollback(event: Step, ctx: HandlerContext) -> bool:
        await ctx.tx.execute("ROLLBACK")
        return True

    bench.hooks["t-1"] = rollback
    await process(bench, [rec("t-0", "a"), rec("t-1", "a"), rec("t-2", "a")],
                  [rec("t-3", "b")])
    assert sorted(await bench.ledger()) == ["t-0", "t-2", "t-3"]
    assert [(e.event_id, e.attempts) for e in bench.sink.entries] == [("t-1", 1)]
    assert bench.invariant() == (4, 4)


async def test_a_handler_that_commits_inside_a_batch_loses_no_other_effect(
    bench_factory: Factory,
) -> None:
    """A COMMIT by a handler commits the claims of the whole batch, including those of records
    whose handlers have not run: the batch goes on in a new transaction, so they keep their
    effects."""
    bench = await bench_factory()

    async def commit(event: Step, ctx: HandlerContext) -> bool:
        await ctx.tx.execute("COMMIT")
        return True

    bench.hooks["u-1"] = commit
    await process(bench, [rec("u-0", "a"), rec("u-1", "a")], [rec("u-2", "b")])
    assert sorted(await bench.ledger()) == ["u-0", "u-2"]  # u-1 writes nothing
    assert bench.sink.entries == []
    assert sorted(o for _, o in bench.reports) == [Outcome.APPLIED] * 3
    assert bench.invariant() == (3, 3)


@pytest.mark.parametrize("where", ["in the handler", "in the database"])
async def test_revoking_a_partition_whose_handler_hangs_in_a_batch_rolls_the_batch_back(
    bench_factory: Factory, where: str,
) -> None:
    """A handler of a revoked partition hangs inside a batch that also holds a record of a
    partition still owned (no handler_timeout). The kill must end that batch's transaction,
    as it does alone: else its claim locks block the partition's new owner, and the owned
    partition's record waits, for as long as the handler hangs."""
    bench = await bench_factory(handler_timeout=None)
    engine = _engine(bench.pipeline)
    engine.batcher = bench.batcher
    engine.revoke_timeout = 0.2
    inside = asyncio.Event()
    hung: list[str] = []

    async def hang(event: Step, ctx: HandlerContext) -> None:
        if not hung:  # only the first run
            hung.append(ctx.envelope.event_id)
            inside.set()
            if where == "in the database":
                await ctx.tx.execute("SELECT pg_sleep(600)")
            await asyncio.Event().wait()

    bench.hooks["h-1"] = hang
    revoked_part: Partition = (TOPIC, 0)
    owned_part: Partition = (TOPIC, 1)
    engine.states[revoked_part] = PartitionState(revoked_part)
    owned = engine.states[owned_part] = PartitionState(owned_part)
    revoked = [rec("h-0", "a"), rec("h-1", "a"), rec("h-2", "a")]
    kept = [rec("k-1", "b", partition=1)]
    engine._dispatch(owned_part, kept, engine.states[owned_part])
    engine._dispatch(revoked_part, revoked, engine.states[revoked_part])
    await asyncio.wait_for(inside.wait(), 10)

    await asyncio.wait_for(engine.on_revoked([revoked_part]), 10)
    # the record of the owned partition is applied on its own, soon
    await asyncio.wait_for(owned.drained.wait(), 10)
    assert owned.offsets.committable() == kept[0].offset + 1

    # the new owner (here the same engine, assigned the partition again) applies the revoked
    # records without waiting for the hung transaction
    await engine.on_assigned([revoked_part])
    engine._dispatch(revoked_part, revoked, engine.states[revoked_part])
    await asyncio.wait_for(engine.lanes.join(), 10)
    assert sorted(await bench.ledger()) == ["h-0", "h-1", "h-2", "k-1"]
    assert bench.invariant() == (7, 7)


# -- end to end, on the broker ----------------------------------------------------------------


async def test_a_batched_consumer_with_poison_swallowers_duplicates_and_garbage(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    """Batches meet every kind of trouble at once: handlers that always fail, a handler that
    swallows a database error, re-sent events and undecodable records. Every good event is
    applied once in key order, the bad ones are dead-lettered, every record is accounted for
    in the stats, and every offset is committed at the end."""
    topic = await ledger_topic(partitions=4)
    events = make_events(keys=20, per_key=10, prefix="mix")
    poison = {"mix-3-10", "mix-7-10"}
    swallower = "mix-5-10"

    async def misbehave(event: LedgerStep, ctx: HandlerContext) -> None:
        if ctx.envelope.event_id in poison:
            raise RuntimeError("poison")
        if ctx.envelope.event_id == swallower:
            with contextlib.suppress(asyncpg.DivisionByZeroError):
                await ctx.tx.execute("SELECT 1/0")

    bad = poison | {swallower}
    resent = [e for e in events if e.seq in (2, 6)][:20]
    garbage = [(f"key-{k}".encode(), b"{not json", [("id", f"junk-{k}".encode()),
                                                      ("event_type", b"step.recorded")])
               for k in (1, 4, 9)]
    await publish(kafka_bootstrap, topic, events)
    await publish_raw(kafka_bootstrap, topic, garbage)
    await publish(kafka_bootstrap, topic, resent)
    total = len(events) + len(garbage) + len(resent)
    consumer = build("mixed", pg_schema, topic, postgres_dsn, kafka_bootstrap, fail=misbehave,
                     limits=Limits(max_batch=50, concurrency=3))
    async with Running(consumer):
        await wait_for(lambda: settled(consumer, total), 120, "every record settled")
    s = consumer.stats
    assert s.batches > 0
    assert s.batch_fallbacks > 0
    assert s.delivered == total
    assert s.delivered == s.applied + s.duplicates + s.dead_lettered + s.expired_skipped + (
        s.abandoned)
    assert (s.applied, s.duplicates, s.dead_lettered) == (
        len(events) - len(bad), len(resent), len(bad) + len(garbage))
    async with pg_pool.acquire() as conn:
        verify(await ledger_rows(conn, pg_schema), [e for e in events if e.event_id not in bad])
        parked = await conn.fetch(
            f"SELECT reason, event_id FROM {identifier(pg_schema)}.dead_letters")
    assert sorted(r["event_id"] for r in parked) == sorted(
        [*bad, *(f"junk-{k}" for k in (1, 4, 9))])
    assert await committed_total(kafka_bootstrap, group("mixed", topic), topic, 4) == total


async def test_a_handler_that_rolls_back_and_begins_again_loses_no_other_effect(
    bench_factory: Factory,
) -> None:
    """ROLLBACK then BEGIN by a handler discards the batch's claims and the effects before it,
    and leaves a transaction open: the batch notices that the transaction is not the one it
    marked, rolls back, and applies its records one by one, where the culprit is
    dead-lettered and the others applied once."""
    bench = await bench_factory()

    async def restart(event: Step, ctx: HandlerContext) -> None:
        await ctx.tx.execute("ROLLBACK")
        await ctx.tx.execute("BEGIN")

    bench.hooks["v-1"] = restart
    await process(bench, [rec("v-0", "a"), rec("v-1", "a")], [rec("v-2", "b")])
    assert sorted(await bench.ledger()) == ["v-0", "v-2"]
    assert [e.event_id for e in bench.sink.entries] == ["v-1"]
    assert "began another" in bench.sink.entries[0].detail
    assert bench.pipeline.stats.batch_fallbacks == 1
    assert bench.invariant() == (3, 3)


async def test_a_handler_that_rolls_back_and_begins_again_alone_is_dead_lettered(
    bench_factory: Factory,
) -> None:
    """With a transaction per record, ROLLBACK then BEGIN would have committed the effects
    after it without the claim (a redelivery would apply them again): noticed at the end,
    dead-lettered, and what the handler wrote after it rolls back."""
    bench = await bench_factory(max_batch=1)

    async def restart(event: Step, ctx: HandlerContext) -> None:
        await ctx.tx.execute("ROLLBACK")
        await ctx.tx.execute("BEGIN")

    bench.hooks["w-1"] = restart
    for record in (rec("w-0", "a"), rec("w-1", "a"), rec("w-2", "a")):
        bench.report(record, await bench.pipeline.process(record, asyncio.Event()))
    assert sorted(await bench.ledger()) == ["w-0", "w-2"]  # w-1's insert rolled back
    assert [(e.event_id, e.attempts) for e in bench.sink.entries] == [("w-1", 1)]
    assert "began another" in bench.sink.entries[0].detail
    assert [o for _, o in bench.reports] == [
        Outcome.APPLIED, Outcome.DEAD_LETTERED, Outcome.APPLIED]


@pytest.mark.parametrize("max_batch", [1, 100])
async def test_a_handler_that_commits_and_begins_again_keeps_every_effect(
    bench_factory: Factory, caplog: pytest.LogCaptureFixture, max_batch: int,
) -> None:
    """COMMIT then BEGIN commits the claims (of the whole batch, in a batch) with the effects
    so far; the open transaction holds the effects after it, so it must commit too, or the
    records whose claims were committed early would lose their effects."""
    bench = await bench_factory(max_batch=max_batch)

    async def commit_and_begin(event: Step, ctx: HandlerContext) -> None:
        await ctx.tx.execute("COMMIT")
        await ctx.tx.execute("BEGIN")

    bench.hooks["y-1"] = commit_and_begin
    with caplog.at_level(logging.ERROR, "consumerkit.pipeline"):
        if max_batch == 1:
            for record in (rec("y-0", "a"), rec("y-1", "a"), rec("y-2", "b")):
                bench.report(record, await bench.pipeline.process(record, asyncio.Event()))
        else:
            await process(bench, [rec("y-0", "a"), rec("y-1", "a")], [rec("y-2", "b")])
    assert sorted(await bench.ledger()) == ["y-0", "y-1", "y-2"]
    assert bench.sink.entries == []
    assert sorted(o for _, o in bench.reports) == [Outcome.APPLIED] * 3
    assert "committed the transaction of" in caplog.text


async def test_records_fetched_before_a_rebalance_never_reach_the_next_ownership(
    bench_factory: Factory,
) -> None:
    """Regression (found by the long torture run: 10 lost, 4 out of order). Records come back
    from a fetch, and before they are dispatched (the dedup cache lookup awaits) a rebalance
    revokes their partition and assigns it here again. Handed to the new ownership, they
    started its watermark at their own offset, past the records still uncommitted before
    them: those were committed over (lost if the consumer then died) and applied after
    their successors. They belong to the ownership that fetched them, and are dropped; the
    new one reads again from the committed offset."""
    bench = await bench_factory()
    engine = _engine(bench.pipeline)
    engine.batcher = bench.batcher
    broker = MemoryBroker()
    broker.create_topic(TOPIC)
    for n in range(3):
        broker.append(TOPIC, Step(key="a", seq=n).model_dump_json().encode(), key=b"a",
                      headers=[("id", f"f-{n}".encode()), ("event_type", b"step.recorded")])
    source = broker.source(topics=[TOPIC], group_id="stale", rebalance=engine)
    await source.start()
    part: Partition = (TOPIC, 0)
    fetched, owners = await fetch_records(source, engine.states, engine.poll_timeout_ms, 10)
    assert [r.offset for r in fetched[part]] == [0, 1, 2]
    assert owners[part] is engine.states[part]

    await engine.on_revoked([part])  # the rebalance, while the records wait
    await engine.on_assigned([part])
    engine._dispatch(part, fetched[part], owners[part])
    assert engine.in_flight == 0
    assert engine.states[part].offsets.committable() is None
    await asyncio.wait_for(engine.lanes.join(), 10)
    assert await bench.ledger() == []

    # the ownership that fetched them applies them
    engine._dispatch(part, fetched[part], engine.states[part])
    await asyncio.wait_for(engine.lanes.join(), 10)
    assert await bench.ledger() == ["f-0", "f-1", "f-2"]
    assert engine.states[part].offsets.committable() == 3
    await source.stop()
