"""A batch handler's call runs in one span of its own, linked to its messages' spans, and the
events it publishes carry that span on (OpenTelemetry's messaging conventions for batch
processing), on a real PostgreSQL through the batcher."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import orjson
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from consumerkit import BatchContext, RetryPolicy, handler, migrate
from consumerkit.deadletter.writer import DeadLetterWriter
from consumerkit.dedup import PostgresDedupStore
from consumerkit.engine.batch import Batcher
from consumerkit.engine.decode import Decoder
from consumerkit.engine.pipeline import Outcome, Pipeline
from consumerkit.envelope import RecordLike, WireFormat
from consumerkit.observability.observer import Fanout
from consumerkit.observability.tracing import Tracing
from consumerkit.outbox import Outbox, OutboxTable
from consumerkit.route_table import RouteTable
from consumerkit.stats import ConsumerStats, StatsObserver

from ..integration.test_batch_handlers import Line, ListSink, rec


async def test_a_batch_handler_call_is_one_span_linked_to_its_messages(
    pg_pool: asyncpg.Pool[asyncpg.Record], pg_schema: str,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    table = OutboxTable(pg_schema, "outbox")
    async with pg_pool.acquire() as conn:
        await migrate(conn, pg_schema)
        await migrate(conn, dedup=None, outboxes=[table])

    @handler("line.added", batch=True)
    async def lines(events: list[Line], ctx: BatchContext) -> None:
        await ctx.publish(caused_by=ctx.envelopes[0], event_type="lines.counted",
                          aggregate_type="lines", aggregate_id="all",
                          payload={"count": len(events)})

    stats, tracing = ConsumerStats(), Tracing(tracer_provider=provider)
    name = f"spans-{uuid.uuid4().hex[:8]}"
    pipeline = Pipeline(
        consumer=name, namespace=name, pool=pg_pool, dedup=PostgresDedupStore(pg_schema),
        decoder=Decoder(RouteTable.build([lines]), WireFormat(), 1 << 20),
        retry=RetryPolicy(max_attempts=1), dead_letters=DeadLetterWriter([ListSink()]),
        expired="dead_letter", stats=stats, concurrency=1, handler_timeout=30.0,
        outbox=Outbox(pg_schema, "outbox"), tracing=tracing,
        observer=Fanout([StatsObserver(stats), tracing]))
    batcher = Batcher(pipeline, 100)
    reports: list[Outcome] = []

    def report(record: RecordLike, outcome: Outcome) -> None:
        reports.append(outcome)

    flag = asyncio.Event()
    try:
        await asyncio.wait_for(asyncio.gather(
            batcher.process([rec("bs-a", "a", 0)], flag, report),
            batcher.process([rec("bs-b", "b", 0)], flag, report)), 30)
    finally:
        await batcher.close()
    assert reports == [Outcome.APPLIED, Outcome.APPLIED]

    spans = exporter.get_finished_spans()
    messages = [s for s in spans if s.attributes and "messaging.message.id" in s.attributes]
    [call] = [s for s in spans if s.attributes
              and s.attributes.get("messaging.batch.message_count") == 2]
    assert sorted(str(s.attributes["messaging.message.id"]) for s in messages  # type: ignore[index]
                  ) == ["bs-a", "bs-b"]
    assert call.kind is SpanKind.CONSUMER
    assert call.parent is None  # a trace of its own: its messages come from many
    assert {link.context.span_id for link in call.links} == {
        s.context.span_id for s in messages}
    async with pg_pool.acquire() as conn:
        [headers] = [orjson.loads(r["headers"]) for r in await conn.fetch(
            f'SELECT headers FROM "{pg_schema}".outbox')]
    _, trace_id, span_id, _ = headers["traceparent"].split("-")
    assert (int(trace_id, 16), int(span_id, 16)) == (call.context.trace_id, call.context.span_id)
