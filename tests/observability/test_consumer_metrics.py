"""A consumer with ``metrics_port``: /readyz turns 200 once it is ready, /metrics counts each
outcome as it happened, the lag falls to 0, /healthz answers."""

from __future__ import annotations

import asyncio

import asyncpg

from consumerkit import DeadLetterTable, HandlerContext, Metrics
from consumerkit.testing.services import free_port
from consumerkit.types import SinkResources

from ..integration.conftest import LedgerTopic
from ..integration.ledger import Event, Running, Step, build, make_events, publish, settled
from ..integration.ledger import wait_for as wait
from .scrape import get, samples, value


class GatedDeadLetters(DeadLetterTable):
    """The dead-letter table, opening only once ``gate`` is set: holds start-up there."""

    def __init__(self, gate: asyncio.Event) -> None:
        super().__init__()
        self.gate = gate

    async def open(self, resources: SinkResources) -> None:
        await self.gate.wait()
        await super().open(resources)


async def test_readiness_outcomes_lag_and_histograms_on_the_metrics_port(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    topic = await ledger_topic(partitions=2)
    events = make_events(keys=4, per_key=5)
    poison = "evt-1-3"
    handlers_open = asyncio.Event()

    async def fail(event: Step, ctx: HandlerContext) -> None:
        await handlers_open.wait()
        if ctx.envelope.event_id == poison:
            raise ValueError("never applicable")

    await publish(kafka_bootstrap, topic, events)
    startup = asyncio.Event()
    port = free_port()
    consumer = build("metrics", pg_schema, topic, postgres_dsn, kafka_bootstrap, fail=fail,
                     metrics=Metrics(port=port, host="127.0.0.1", refresh_interval=0.1),
                     dead_letter=GatedDeadLetters(startup))
    run = asyncio.create_task(consumer.run())
    try:
        await wait(lambda: _answers(port), 30, "the metrics port to answer")
        assert await get(port, "/readyz") == (503, "starting\n")
        assert await get(port, "/healthz") == (200, "ok\n")
        assert (await get(port, "/nothing"))[0] == 404
        assert value(await samples(port), "consumerkit_ready", role="consumer") == 0
        startup.set()
        await wait(lambda: _status(port, "/readyz", 200), 60, "/readyz to turn 200")
        assert value(await samples(port), "consumerkit_ready", role="consumer") == 1

        # the handlers wait: nothing is committed, so the lag is every record
        await wait(lambda: _lag(port, len(events)), 30, "the lag to count every record")
        handlers_open.set()
        await wait(lambda: settled(consumer, len(events)), 60, "every event settled")

        # duplicates of committed events: absorbed, and their original's age observed
        again = [Event(e.event_id, e.key, e.seq) for e in events[:5]]
        await publish(kafka_bootstrap, topic, again)
        await wait(lambda: settled(consumer, len(events) + len(again)), 60, "duplicates")
        await wait(lambda: _lag(port, 0), 30, "the lag to fall to 0")

        found = await samples(port)
        name = consumer.name
        messages = "consumerkit_messages_total"
        assert value(found, messages, consumer=name, topic=topic,
                     outcome="applied") == len(events) - 1
        assert value(found, messages, outcome="duplicate") == len(again)
        assert value(found, messages, outcome="dead_lettered") == 1
        assert value(found, messages, outcome="expired_skipped") is None
        route = next(iter({dict(ls)["handler"] for (n, ls) in found
                           if n == "consumerkit_handler_seconds_count"}))
        assert route.endswith("record_step")
        assert value(found, "consumerkit_retries_total", consumer=name,
                     handler=route) == 3  # max_attempts 4: three retries
        handled = value(found, "consumerkit_handler_seconds_count", handler=route)
        assert handled is not None
        assert handled >= len(events) + 3
        assert value(found, "consumerkit_duplicate_age_seconds_count", consumer=name) == len(
            again)
        ahead = value(found, "consumerkit_dedup_partitions_ahead_seconds", consumer=name)
        assert ahead is not None
        assert ahead > 0
        partitions = {dict(ls)["partition"] for (n, ls) in found
                      if n == "consumerkit_consumer_lag"}
        assert partitions == {"0", "1"}
        assert consumer.stats.applied == len(events) - 1  # the stats see the same outcomes
        assert consumer.stats.duplicates == len(again)
        assert await consumer.readiness() is None
    finally:
        startup.set()
        handlers_open.set()
        await consumer.stop()
        await run
    assert await consumer.readiness() == "stopping"
    assert (await get(port, "/healthz"))[0] == 0  # the endpoint closed with the consumer


async def test_two_consumers_in_one_process_keep_separate_registries(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
) -> None:
    topic = await ledger_topic(partitions=1)
    await publish(kafka_bootstrap, topic, make_events(keys=2, per_key=2))
    ports = free_port(), free_port()
    first, second = (
        build(f"twin{i}", pg_schema, topic, postgres_dsn, kafka_bootstrap,
              metrics=Metrics(port=port, host="127.0.0.1")) for i, port in enumerate(ports))
    async with Running(first), Running(second):
        await wait(lambda: settled(first, 4), 60, "the first consumer settled")
        await wait(lambda: settled(second, 4), 60, "the second consumer settled")
        for port, consumer in zip(ports, (first, second), strict=True):
            found = await samples(port)
            assert value(found, "consumerkit_messages_total", outcome="applied") == 4
            assert {dict(ls)["consumer"] for (n, ls) in found
                    if n == "consumerkit_messages_total"} == {consumer.name}
    assert first.registry is not second.registry


async def _answers(port: int) -> bool:
    return (await get(port, "/healthz"))[0] == 200


async def _status(port: int, path: str, status: int) -> bool:
    return (await get(port, path))[0] == status


async def _lag(port: int, total: int) -> bool:
    found = await samples(port)
    lags = [v for (n, _), v in found.items() if n == "consumerkit_consumer_lag"]
    return len(lags) == 2 and sum(lags) == total
