"""Batch handlers and deferred writes on a real PostgreSQL, driven through the pipeline and the
batcher directly (records built in memory), so each case is deterministic: one call per batch in
per-key order, a handler reading its own deferred writes, and a failure (a raising batch handler,
a deferred write the database refuses) isolated to its record."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import asyncpg
import pytest
from pydantic import BaseModel

from consumerkit import BatchContext, HandlerContext, RetryPolicy, handler, migrate
from consumerkit.deadletter.entry import DeadLetterEntry
from consumerkit.deadletter.writer import DeadLetterWriter
from consumerkit.dedup import PostgresDedupStore
from consumerkit.engine.batch import Batcher
from consumerkit.engine.decode import Decoder
from consumerkit.engine.pipeline import Outcome, Pipeline
from consumerkit.envelope import Record, RecordLike, WireFormat
from consumerkit.route_table import RouteTable
from consumerkit.shared.identifiers import identifier
from consumerkit.stats import ConsumerStats

TOPIC = "lines"


class Line(BaseModel):
    key: str
    seq: int
    fail: bool = False  # the batch handler raises when its call holds this event


class ListSink:
    def __init__(self) -> None:
        self.entries: list[DeadLetterEntry] = []

    async def open(self, resources: object) -> None:
        pass

    async def send(self, entry: DeadLetterEntry) -> None:
        self.entries.append(entry)

    async def close(self) -> None:
        pass


@dataclass
class Bench:
    pool: asyncpg.Pool
    table: str
    pipeline: Pipeline
    batcher: Batcher
    sink: ListSink
    calls: list[list[str]] = field(default_factory=list)  # event ids of each batch call
    seen: dict[str, int] = field(default_factory=dict)  # event id -> rows of its key it read
    reports: list[tuple[str, Outcome]] = field(default_factory=list)

    def report(self, record: RecordLike, outcome: Outcome) -> None:
        self.reports.append(((dict(record.headers or ())["id"] or b"").decode(), outcome))

    async def lines(self) -> list[tuple[str, int]]:
        rows = await self.pool.fetch(f"SELECT key, seq FROM {self.table} ORDER BY id")
        return [(r["key"], r["seq"]) for r in rows]


_offsets = iter(range(1_000_000))


def rec(event_id: str, key: str, seq: int, event_type: str = "line.added", *,
        fail: bool = False) -> Record:
    value = Line(key=key, seq=seq, fail=fail).model_dump_json().encode()
    return Record(TOPIC, 0, next(_offsets), key.encode(), value,
                  [("id", event_id.encode()), ("event_type", event_type.encode())],
                  int(time.time() * 1000))


@pytest.fixture
async def bench(pg_pool: asyncpg.Pool, pg_schema: str) -> AsyncIterator[Bench]:
    s = identifier(pg_schema)
    table = f"{s}.lines"
    async with pg_pool.acquire() as conn:
        await migrate(conn, pg_schema)
        # seq >= 0: a line with a negative seq is refused by the database, at the deferred
        # write that carries it
        await conn.execute(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, "
                           "key text NOT NULL, seq int NOT NULL CHECK (seq >= 0))")
    insert = f"INSERT INTO {table} (key, seq) VALUES ($1, $2)"
    count = f"SELECT count(*) FROM {table} WHERE key = $1"
    calls: list[list[str]] = []
    seen: dict[str, int] = {}

    @handler("line.added", batch=True)
    async def add_lines(events: list[Line], ctx: BatchContext) -> None:
        calls.append([e.event_id for e in ctx.envelopes])
        if any(e.fail for e in events):
            raise RuntimeError("a line of this call is refused")
        for event in events:
            ctx.defer(insert, event.key, event.seq)

    @handler("line.counted")  # per record: defers its write, then reads its key's rows
    async def count_line(event: Line, ctx: HandlerContext) -> None:
        ctx.defer(insert, event.key, event.seq)
        seen[ctx.envelope.event_id] = await ctx.tx.fetchval(count, event.key)

    @handler("line.sent")  # per record: awaits its write, as before deferred writes
    async def send_line(event: Line, ctx: HandlerContext) -> None:
        await ctx.tx.execute(insert, event.key, event.seq)

    sink = ListSink()
    name = f"lines-{uuid.uuid4().hex[:8]}"
    pipeline = Pipeline(
        consumer=name, namespace=name, pool=pg_pool, dedup=PostgresDedupStore(pg_schema),
        decoder=Decoder(RouteTable.build([add_lines, count_line, send_line]), WireFormat(),
                        1 << 20),
        retry=RetryPolicy(max_attempts=3, initial_delay=0.01, max_delay=0.02),
        dead_letters=DeadLetterWriter([sink]), expired="dead_letter", stats=ConsumerStats(),
        concurrency=2, handler_timeout=30.0)
    made = Bench(pg_pool, table, pipeline, Batcher(pipeline, 100), sink, calls, seen)
    yield made
    await made.batcher.close()


async def process(bench: Bench, *groups: Sequence[Record]) -> None:
    """Hand ``groups`` (one lane each) to the batcher at once: they share a batch."""
    flag = asyncio.Event()
    await asyncio.wait_for(asyncio.gather(
        *(bench.batcher.process(group, flag, bench.report) for group in groups)), 30)


def invariant(bench: Bench) -> tuple[int, int]:
    s = bench.pipeline.stats
    return s.delivered, s.applied + s.duplicates + s.dead_lettered + s.expired_skipped


async def test_one_call_per_batch_with_the_fresh_events_in_key_order(bench: Bench) -> None:
    await process(bench, [rec("a-0", "a", 0)])  # applied before: a duplicate below
    bench.calls.clear()
    await process(bench, [rec("a-0", "a", 0), rec("a-1", "a", 1), rec("a-2", "a", 2)],
                  [rec("b-0", "b", 0), rec("b-1", "b", 1)])
    assert bench.calls == [["a-1", "a-2", "b-0", "b-1"]]
    assert await bench.lines() == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)]
    assert sorted(bench.reports[1:]) == [("a-0", Outcome.DUPLICATE), ("a-1", Outcome.APPLIED),
                                         ("a-2", Outcome.APPLIED), ("b-0", Outcome.APPLIED),
                                         ("b-1", Outcome.APPLIED)]
    assert bench.pipeline.stats.batches == 2
    assert invariant(bench) == (6, 6)


async def test_a_key_mixing_types_keeps_its_order_across_the_calls(bench: Bench) -> None:
    await process(bench, [rec("m-0", "a", 0), rec("m-1", "a", 1, "line.sent"),
                          rec("m-2", "a", 2), rec("m-3", "a", 3, "line.counted")],
                  [rec("n-0", "b", 0), rec("n-1", "b", 1)])
    # b joins the latest call of the batch handler: nothing of b runs in between
    assert bench.calls == [["m-0"], ["m-2", "n-0", "n-1"]]
    lines = await bench.lines()
    assert [seq for key, seq in lines if key == "a"] == [0, 1, 2, 3]
    assert bench.seen == {"m-3": 4}  # it read its own deferred write and the three before
    assert invariant(bench) == (6, 6)


async def test_a_raising_batch_handler_is_isolated_and_its_event_dead_lettered_alone(
    bench: Bench,
) -> None:
    await process(bench, [rec("f-0", "a", 0), rec("f-1", "a", 1, fail=True), rec("f-2", "a", 2)],
                  [rec("g-0", "b", 0)])
    assert bench.pipeline.stats.batch_fallbacks == 1
    # the batch's call, then one call per record (lanes side by side), the refused one three
    # times (its attempts)
    first, *alone = bench.calls
    assert first == ["f-0", "f-1", "f-2", "g-0"]
    assert [c for c in alone if c[0].startswith("f")] == [["f-0"], ["f-1"], ["f-1"], ["f-1"],
                                                          ["f-2"]]
    assert [c for c in alone if c[0].startswith("g")] == [["g-0"]]
    assert [(e.event_id, e.attempts, e.reason) for e in bench.sink.entries] == [
        ("f-1", 3, "handler_failed")]
    assert sorted(await bench.lines()) == [("a", 0), ("a", 2), ("b", 0)]
    assert invariant(bench) == (4, 4)


async def test_a_deferred_write_refused_in_a_batch_fails_only_its_record(
    bench: Bench,
) -> None:
    """The database refuses one deferred write (seq < 0) when the batch's writes are sent:
    the batch rolls back, its records run one by one, and only the culprit fails, retried
    and then dead-lettered; the others are applied."""
    await process(bench, [rec("d-0", "a", 0, "line.counted"),
                          rec("d-1", "a", -1, "line.counted"),
                          rec("d-2", "a", 2, "line.counted")],
                  [rec("e-0", "b", 0), rec("e-1", "b", 1)])
    assert bench.pipeline.stats.batch_fallbacks == 1
    [entry] = bench.sink.entries
    assert (entry.event_id, entry.attempts, entry.reason) == ("d-1", 3, "handler_failed")
    assert "CheckViolationError" in entry.detail
    assert sorted(await bench.lines()) == [("a", 0), ("a", 2), ("b", 0), ("b", 1)]
    assert invariant(bench) == (5, 5)


async def test_a_deferred_write_refused_at_the_end_of_a_batch_call(bench: Bench) -> None:
    """A batch handler's deferred writes are sent after the call: a refused one rolls the
    batch back; one by one, the culprit's own transaction fails and the rest apply."""
    await process(bench, [rec("h-0", "a", 0), rec("h-1", "a", -5)], [rec("i-0", "b", 0)])
    assert [(e.event_id, e.attempts) for e in bench.sink.entries] == [("h-1", 3)]
    assert sorted(await bench.lines()) == [("a", 0), ("b", 0)]
    assert invariant(bench) == (3, 3)


async def test_with_batches_of_one_a_batch_handler_gets_a_list_of_one(bench: Bench) -> None:
    outcome = await bench.pipeline.process(rec("o-0", "a", 0), asyncio.Event())
    assert outcome is Outcome.APPLIED
    assert bench.calls == [["o-0"]]
    assert await bench.lines() == [("a", 0)]


Check = Callable[[HandlerContext], Awaitable[object]]


@pytest.mark.parametrize("how", ["fetch", "savepoint", "savepoint-start", "cursor", "prepare",
                                 "executemany"])
async def test_a_handler_reads_its_own_deferred_writes_whatever_it_reads_with(
    pg_pool: asyncpg.Pool, pg_schema: str, how: str,
) -> None:
    s = identifier(pg_schema)
    async with pg_pool.acquire() as conn:
        await migrate(conn, pg_schema)
        await conn.execute(f"CREATE TABLE {s}.notes (id bigserial PRIMARY KEY, note text)")
    insert, select = f"INSERT INTO {s}.notes (note) VALUES ($1)", f"SELECT note FROM {s}.notes"
    read: list[list[str]] = []

    @handler("note.taken")
    async def take_note(event: Line, ctx: HandlerContext) -> None:
        ctx.defer(insert, "first")
        ctx.defer(insert, "second")  # with the first: one executemany
        if how == "fetch":
            read.append([r["note"] for r in await ctx.tx.fetch(select + " ORDER BY id")])
        elif how == "savepoint":  # the queue is sent before the savepoint: kept by its rollback
            with contextlib.suppress(ValueError):
                async with ctx.tx.transaction():
                    await ctx.tx.execute(insert, "undone")
                    raise ValueError("undone")
            read.append([r["note"] for r in await ctx.tx.fetch(select + " ORDER BY id")])
        elif how == "savepoint-start":
            savepoint = ctx.tx.transaction()
            await savepoint.start()
            await ctx.tx.execute(insert, "undone")
            await savepoint.rollback()
            read.append([r["note"] for r in await ctx.tx.fetch(select + " ORDER BY id")])
        elif how == "cursor":
            read.append([r["note"] async for r in ctx.tx.cursor(select + " ORDER BY id")])
        elif how == "prepare":
            statement = await ctx.tx.prepare(select + " ORDER BY id")
            read.append([r["note"] for r in await statement.fetch()])
        else:
            await ctx.tx.executemany(insert, [("third",)])
            read.append([r["note"] for r in await ctx.tx.fetch(select + " ORDER BY id")])
        ctx.defer(insert, "last")  # sent before the commit

    name = f"notes-{uuid.uuid4().hex[:8]}"
    pipeline = Pipeline(
        consumer=name, namespace=name, pool=pg_pool, dedup=PostgresDedupStore(pg_schema),
        decoder=Decoder(RouteTable.build([take_note]), WireFormat(), 1 << 20),
        retry=RetryPolicy(max_attempts=1), dead_letters=DeadLetterWriter([ListSink()]),
        expired="dead_letter", stats=ConsumerStats(), concurrency=1, handler_timeout=30.0)
    record = rec("note-1", "a", 0, "note.taken")
    assert await pipeline.process(record, asyncio.Event()) is Outcome.APPLIED
    expected = ["first", "second", *(["third"] if how == "executemany" else [])]
    assert read == [expected]
    rows = await pg_pool.fetch(select + " ORDER BY id")
    assert [r["note"] for r in rows] == [*expected, "last"]
