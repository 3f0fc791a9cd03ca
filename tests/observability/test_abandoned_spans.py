"""A message left unfinished at a shutdown or a revocation ends its span (outcome
``abandoned``): no span stays open, unexported, until the cap on open spans drops it."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel

from consumerkit import HandlerContext, Limits, Postgres, Retry, Timeouts, handler
from consumerkit.observability.tracing import Tracing
from consumerkit.testing import TestConsumer


class Job(BaseModel):
    n: int


async def test_a_message_abandoned_while_waiting_for_a_retry_ends_its_span(
    consumerkit_dsn: str, consumerkit_schema: str,
) -> None:
    @handler("job.run")
    async def run(event: Job, ctx: HandlerContext) -> None:
        if event.n == 1:
            raise Retry(delay=3600)  # waits for its retry until the consumer stops

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    kit = TestConsumer([run],
                       postgres=Postgres(dsn=consumerkit_dsn, schema=consumerkit_schema),
                       observers=[Tracing(tracer_provider=provider)], partitions=1)
    async with kit:
        kit.publish(Job(n=0), key="a")
        waiting = kit.publish(Job(n=1), key="b")
        async with asyncio.timeout(30):
            while kit.stats.retries < 1 or kit.stats.applied < 1:
                await asyncio.sleep(0.01)
    assert kit.stats.abandoned == 1
    outcomes = {dict(s.attributes or {})["messaging.kafka.message.offset"]:
                dict(s.attributes or {})["consumerkit.outcome"]
                for s in exporter.get_finished_spans()}
    assert outcomes == {0: "applied", waiting.offset: "abandoned"}


@pytest.mark.parametrize("max_batch", [1, 100])
async def test_a_handler_cut_short_at_shutdown_ends_its_span(
    max_batch: int, consumerkit_dsn: str, consumerkit_schema: str,
) -> None:
    running = asyncio.Event()

    @handler("job.run")
    async def hang(event: Job, ctx: HandlerContext) -> None:
        running.set()
        await asyncio.Event().wait()  # until cancelled by the shutdown

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    kit = TestConsumer([hang],
                       postgres=Postgres(dsn=consumerkit_dsn, schema=consumerkit_schema),
                       limits=Limits(max_batch=max_batch),
                       timeouts=Timeouts(shutdown=0.2),
                       observers=[Tracing(tracer_provider=provider)], partitions=1)
    async with kit:
        kit.publish(Job(n=0), key="a")
        async with asyncio.timeout(30):
            await running.wait()
    assert kit.stats.abandoned == 1
    [span] = exporter.get_finished_spans()
    assert dict(span.attributes or {})["consumerkit.outcome"] == "abandoned"
