"""Failing cases found in review of the one transaction path, batch handlers and deferred
writes, each on a real PostgreSQL through the pipeline (and the batcher)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import asyncpg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from consumerkit import BatchContext, Envelope, HandlerContext, RetryPolicy, handler, migrate
from consumerkit.deadletter.writer import DeadLetterWriter
from consumerkit.dedup import PostgresDedupStore
from consumerkit.engine.batch import Batcher
from consumerkit.engine.decode import Decoder
from consumerkit.engine.pipeline import Outcome, Pipeline
from consumerkit.envelope import RecordLike, WireFormat
from consumerkit.errors import ConsumerKitError, DeadLetter
from consumerkit.observability.tracing import Tracing
from consumerkit.route_table import RouteTable
from consumerkit.shared.identifiers import identifier
from consumerkit.stats import ConsumerStats

from .test_batch_handlers import Line, ListSink, rec


@dataclass
class Setup:
    pool: asyncpg.Pool
    table: str
    insert: str
    select: str
    sink: ListSink = field(default_factory=ListSink)
    reports: dict[str, Outcome] = field(default_factory=dict)

    def report(self, record: RecordLike, outcome: Outcome) -> None:
        self.reports[(dict(record.headers or ())["id"] or b"").decode()] = outcome

    def pipeline(self, handlers: list[Callable[..., object]], schema: str,
                 tracing: Tracing | None = None, attempts: int = 1) -> Pipeline:
        name = f"review-{uuid.uuid4().hex[:8]}"
        return Pipeline(
            consumer=name, namespace=name, pool=self.pool, dedup=PostgresDedupStore(schema),
            decoder=Decoder(RouteTable.build(handlers), WireFormat(), 1 << 20),  # type: ignore[arg-type]
            retry=RetryPolicy(max_attempts=attempts, initial_delay=0.01, max_delay=0.02),
            dead_letters=DeadLetterWriter([self.sink]),
            expired="dead_letter", stats=ConsumerStats(), concurrency=2, handler_timeout=30.0,
            tracing=tracing)

    async def notes(self) -> list[str]:
        return [r["note"] for r in await self.pool.fetch(self.select)]


@pytest.fixture
async def setup(pg_pool: asyncpg.Pool, pg_schema: str) -> Setup:
    s = identifier(pg_schema)
    async with pg_pool.acquire() as conn:
        await migrate(conn, pg_schema)
        await conn.execute(f"CREATE TABLE {s}.notes (id bigserial PRIMARY KEY, "
                           "note text NOT NULL CHECK (note <> 'refused'))")
    return Setup(pg_pool, f"{s}.notes", f"INSERT INTO {s}.notes (note) VALUES ($1)",
                 f"SELECT note FROM {s}.notes ORDER BY id")


async def test_a_rolled_back_savepoint_drops_the_writes_deferred_inside_it(
    setup: Setup, pg_schema: str,
) -> None:
    """The savepoint is left without sending what was queued inside it: its rollback cannot
    undo those writes, which are sent later, outside it, and committed."""

    @handler("note.taken")
    async def take(event: Line, ctx: HandlerContext) -> None:
        ctx.defer(setup.insert, "kept")
        with contextlib.suppress(ValueError):
            async with ctx.tx.transaction():
                ctx.defer(setup.insert, "undone")
                raise ValueError("roll the savepoint back")

    pipeline = setup.pipeline([take], pg_schema)
    assert await pipeline.process(rec("sp-1", "a", 0, "note.taken"),
                                  asyncio.Event()) is Outcome.APPLIED
    assert await setup.notes() == ["kept"]


async def test_a_savepoint_guards_the_writes_deferred_inside_it(
    setup: Setup, pg_schema: str,
) -> None:
    """A write deferred inside a savepoint whose failure the handler catches there fails the
    record instead: the write is sent after the savepoint ended."""

    @handler("note.taken")
    async def take(event: Line, ctx: HandlerContext) -> None:
        with contextlib.suppress(asyncpg.CheckViolationError):
            async with ctx.tx.transaction():
                ctx.defer(setup.insert, "refused")
        await ctx.tx.execute(setup.insert, "done")

    pipeline = setup.pipeline([take], pg_schema)
    outcome = await pipeline.process(rec("sp-2", "a", 0, "note.taken"), asyncio.Event())
    assert [e.detail for e in setup.sink.entries] == []
    assert outcome is Outcome.APPLIED
    assert await setup.notes() == ["done"]


async def test_a_prepared_statement_reads_the_writes_deferred_before_it_runs(
    setup: Setup, pg_schema: str,
) -> None:
    """``ctx.tx.prepare`` sends the queue when preparing, not when the statement runs: a
    write deferred in between is not sent before the read."""
    read: list[list[str]] = []

    @handler("note.taken")
    async def take(event: Line, ctx: HandlerContext) -> None:
        statement = await ctx.tx.prepare(setup.select)
        ctx.defer(setup.insert, "mine")
        read.append([r["note"] for r in await statement.fetch()])

    pipeline = setup.pipeline([take], pg_schema)
    assert await pipeline.process(rec("ps-1", "a", 0, "note.taken"),
                                  asyncio.Event()) is Outcome.APPLIED
    assert read == [["mine"]]


async def test_a_failure_is_charged_to_its_own_record_not_to_an_earlier_recovered_one(
    setup: Setup, pg_schema: str,
) -> None:
    """Record a's handler recovers from a refused deferred write inside a savepoint; record
    b's handler then raises. ``Deferred.broke`` still names a's call, so b's failure is
    charged to a: a is dead-lettered (max_attempts=1) and its effect lost, though its
    handler succeeds."""

    @handler("note.tried")
    async def tried(event: Line, ctx: HandlerContext) -> None:
        with contextlib.suppress(asyncpg.CheckViolationError):
            async with ctx.tx.transaction():
                ctx.defer(setup.insert, "refused")
                await ctx.tx.fetchval("SELECT 1")  # sends the queue inside the savepoint
        await ctx.tx.execute(setup.insert, f"tried {event.key}")

    @handler("note.broken")
    async def broken(event: Line, ctx: HandlerContext) -> None:
        raise ValueError("b's own bug")

    pipeline = setup.pipeline([tried, broken], pg_schema)
    batcher = Batcher(pipeline, 100)
    flag = asyncio.Event()
    try:
        await asyncio.wait_for(asyncio.gather(
            batcher.process([rec("rt-a", "a", 0, "note.tried")], flag, setup.report),
            batcher.process([rec("rt-b", "b", 0, "note.broken")], flag, setup.report)), 30)
    finally:
        await batcher.close()
    assert setup.reports == {"rt-a": Outcome.APPLIED, "rt-b": Outcome.DEAD_LETTERED}
    assert await setup.notes() == ["tried a"]


async def test_a_dead_letter_signal_is_charged_to_its_own_record(
    setup: Setup, pg_schema: str,
) -> None:
    """As above, with retries: b's handler refuses its event (``DeadLetter``). The signal is
    charged to a, which is dead-lettered at once, as refused by its handler, without a retry
    and though its handler never refused anything."""

    @handler("note.tried")
    async def tried(event: Line, ctx: HandlerContext) -> None:
        with contextlib.suppress(asyncpg.CheckViolationError):
            async with ctx.tx.transaction():
                ctx.defer(setup.insert, "refused")
                await ctx.tx.fetchval("SELECT 1")
        await ctx.tx.execute(setup.insert, f"tried {event.key}")

    @handler("note.refusing")
    async def refusing(event: Line, ctx: HandlerContext) -> None:
        raise DeadLetter("b is refused")

    pipeline = setup.pipeline([tried, refusing], pg_schema, attempts=3)
    batcher = Batcher(pipeline, 100)
    flag = asyncio.Event()
    try:
        await asyncio.wait_for(asyncio.gather(
            batcher.process([rec("dl-a", "a", 0, "note.tried")], flag, setup.report),
            batcher.process([rec("dl-b", "b", 0, "note.refusing")], flag, setup.report)), 30)
    finally:
        await batcher.close()
    assert [(e.event_id, e.reason) for e in setup.sink.entries] == [
        ("dl-b", "dead_lettered_by_handler")]
    assert await setup.notes() == ["tried a"]


async def test_ctx_tx_is_still_an_asyncpg_connection(setup: Setup, pg_schema: str) -> None:
    """On main ``ctx.tx`` is the pool's connection proxy, an ``asyncpg.Connection`` to
    ``isinstance``; the wrapper is not."""
    seen: list[bool] = []

    @handler("note.taken")
    async def take(event: Line, ctx: HandlerContext) -> None:
        seen.append(isinstance(ctx.tx, asyncpg.Connection))

    pipeline = setup.pipeline([take], pg_schema)
    assert await pipeline.process(rec("is-1", "a", 0, "note.taken"),
                                  asyncio.Event()) is Outcome.APPLIED
    assert seen == [True]


async def test_a_batch_handler_runs_in_a_span_as_a_per_record_handler_does(
    setup: Setup, pg_schema: str,
) -> None:
    spans: dict[str, bool] = {}

    @handler("note.taken")
    async def one(event: Line, ctx: HandlerContext) -> None:
        spans["one"] = trace.get_current_span().get_span_context().is_valid

    @handler("note.batched", batch=True)
    async def many(events: list[Line], ctx: BatchContext) -> None:
        spans["many"] = trace.get_current_span().get_span_context().is_valid

    tracing = Tracing(tracer_provider=TracerProvider())
    pipeline = setup.pipeline([one, many], pg_schema, tracing)
    assert await pipeline.process(rec("tr-1", "a", 0, "note.taken"),
                                  asyncio.Event()) is Outcome.APPLIED
    assert await pipeline.process(rec("tr-2", "a", 1, "note.batched"),
                                  asyncio.Event()) is Outcome.APPLIED
    assert spans == {"one": True, "many": True}


async def test_a_context_built_by_hand_refuses_deferred_writes(setup: Setup) -> None:
    """Handlers are tested by calling them with a ``HandlerContext`` built on a real
    transaction (as ``tests/docs/test_examples_live.py`` does). Nothing sends what such a
    handler defers (``defer`` is not awaited, and the caller commits on its own connection),
    so ``defer`` says so instead of dropping the write."""
    async def take(event: Line, ctx: HandlerContext) -> None:
        ctx.defer(setup.insert, "by hand")

    envelope = Envelope("evt-1", "header", "note.taken", "k", "t", 0, 0, datetime.now(UTC))
    async with setup.pool.acquire() as conn, conn.transaction():
        with pytest.raises(ConsumerKitError, match="built by hand"):
            await take(Line(key="k", seq=0), HandlerContext(conn, envelope, 1))
    assert await setup.notes() == []


async def test_a_write_deferred_after_the_last_send_raises(setup: Setup, pg_schema: str) -> None:
    """A context kept past its handler (a task that outlived it) cannot queue a write that
    nothing would send."""
    kept: list[HandlerContext] = []

    @handler("note.taken")
    async def take(event: Line, ctx: HandlerContext) -> None:
        ctx.defer(setup.insert, "sent")
        kept.append(ctx)

    pipeline = setup.pipeline([take], pg_schema)
    assert await pipeline.process(rec("late-1", "a", 0, "note.taken"),
                                  asyncio.Event()) is Outcome.APPLIED
    with pytest.raises(ConsumerKitError, match="would be lost"):
        kept[0].defer(setup.insert, "late")
    assert await setup.notes() == ["sent"]


async def test_a_deferred_write_without_arguments_behaves_alike_alone_and_in_a_run(
    setup: Setup, pg_schema: str,
) -> None:
    """Alone, a deferred write without arguments is sent with ``execute`` (the simple
    protocol, which takes several statements); two in a run go as one ``executemany`` (a
    prepared statement, which does not). Each record applies alone, but every batch of two
    or more rolls back and falls back to one by one."""
    two = (f"INSERT INTO {setup.table} (note) VALUES ('x'); "
           f"INSERT INTO {setup.table} (note) VALUES ('y')")

    @handler("note.taken")
    async def take(event: Line, ctx: HandlerContext) -> None:
        ctx.defer(two)

    pipeline = setup.pipeline([take], pg_schema)
    batcher = Batcher(pipeline, 100)
    flag = asyncio.Event()
    try:
        await asyncio.wait_for(asyncio.gather(
            batcher.process([rec("ms-a", "a", 0, "note.taken")], flag, setup.report),
            batcher.process([rec("ms-b", "b", 0, "note.taken")], flag, setup.report)), 30)
    finally:
        await batcher.close()
    assert setup.reports == {"ms-a": Outcome.APPLIED, "ms-b": Outcome.APPLIED}
    assert pipeline.stats.batch_fallbacks == 0
