"""One trace from the order's write through the relay to the billing handler and the event it
publishes: the outbox carries ``traceparent``, the relay keeps it, the consumer's span is its
child and the handler's own event carries the same trace on."""

from __future__ import annotations

import asyncpg
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, format_trace_id
from pydantic import BaseModel

from consumerkit import Consumer, HandlerContext, Kafka, Postgres, handler, migrate
from consumerkit.observability.tracing import Tracing
from consumerkit.outbox import KafkaSink, Outbox, OutboxTable, Relay
from consumerkit.testing.services import MakeTopic

from ..brokers import PRODUCER_OPTIONS
from ..integration.ledger import FAST_GROUP, Running, settled
from ..integration.ledger import wait_for as wait
from ..outbox.conftest import RelayRunning, read_all


class OrderPlaced(BaseModel):
    order_id: str
    amount: int


async def test_one_trace_from_the_order_through_the_relay_to_billing_and_on(
    pg_pool: asyncpg.Pool[asyncpg.Record], postgres_dsn: str, kafka_bootstrap: str,
    make_topic: MakeTopic, pg_schema: str,
) -> None:
    orders, invoices = await make_topic(partitions=2), await make_topic(partitions=1)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    table = OutboxTable(pg_schema, "outbox")
    outbox = Outbox(pg_schema, "outbox")
    async with pg_pool.acquire() as conn:
        await migrate(conn, dedup=None, outboxes=[table])

    # the order service writes the order and its event in one transaction, inside a span
    with provider.get_tracer("orders").start_as_current_span("place order") as placing:
        async with pg_pool.acquire() as conn, conn.transaction():
            await outbox.add(conn, event_type="order.placed", aggregate_type=orders,
                             aggregate_id="o-1", payload=OrderPlaced(order_id="o-1", amount=7))
    trace_id = placing.get_span_context().trace_id

    @handler("order.placed")
    async def bill(event: OrderPlaced, ctx: HandlerContext) -> None:
        await ctx.publish(event_type="invoice.created", aggregate_type=invoices,
                          aggregate_id=event.order_id, payload={"amount": event.amount})

    billing = Consumer(
        name=f"billing.{orders}", handlers=[bill], topics=[orders],
        postgres=Postgres(dsn=postgres_dsn, schema=pg_schema),
        kafka=Kafka(bootstrap=kafka_bootstrap, consumer_options=FAST_GROUP),
        outbox=outbox, handle_signals=False, observers=[Tracing(tracer_provider=provider)])
    relay = Relay(Postgres(dsn=postgres_dsn, schema=pg_schema), KafkaSink(kafka_bootstrap,
        route="{aggregate_type}",
                                          kafka_options=dict(PRODUCER_OPTIONS)),
                  table="outbox", handle_signals=False)
    async with RelayRunning(relay), Running(billing):
        await wait(lambda: settled(billing, 1), 60, "the order billed")
        published = await read_all(kafka_bootstrap, [invoices], lambda found: len(found) >= 1)
    orders_published = await read_all(kafka_bootstrap, [orders], lambda found: len(found) >= 1)

    trace_hex = format_trace_id(trace_id)
    # the relay kept the writer's context on the order event
    assert orders_published[0].headers["traceparent"].decode().split("-")[1] == trace_hex
    # the consumer's span: a child of the writer's, after the messaging conventions
    [span] = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.CONSUMER]
    assert span.context.trace_id == trace_id
    assert span.parent is not None
    assert span.parent.span_id == placing.get_span_context().span_id
    assert span.name == f"process {orders}"
    attributes = dict(span.attributes or {})
    assert attributes["messaging.system"] == "kafka"
    assert attributes["messaging.operation"] == "process"
    assert attributes["messaging.destination.name"] == orders
    assert attributes["messaging.kafka.message.offset"] == 0
    assert attributes["messaging.message.id"] == orders_published[0].headers["id"].decode()
    assert attributes["consumerkit.outcome"] == "applied"
    assert attributes["consumerkit.duplicate"] is False
    # the invoice the handler published carries the consumer span's context on
    [invoice] = published
    _, invoice_trace, parent_span, _ = invoice.headers["traceparent"].decode().split("-")
    assert invoice_trace == trace_hex
    assert int(parent_span, 16) == span.context.span_id
