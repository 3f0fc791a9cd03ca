"""A relay whose run ends without stop() (cancelled, as a forced stop does) reports
"stopping" to its observers, not the lost lock connection that its end tears down."""

from __future__ import annotations

import asyncio

from consumerkit import Postgres
from consumerkit.observability import BaseObserver
from consumerkit.outbox import KafkaSink, OutboxTable, Relay
from consumerkit.testing.services import MakeTopic

from ..brokers import PRODUCER_OPTIONS
from ..pooling import POOLER
from .conftest import wait_until


class Readiness(BaseObserver):
    def __init__(self) -> None:
        self.reasons: list[str | None] = []

    def readiness(self, role: str, name: str, reason: str | None) -> None:
        self.reasons.append(reason)


async def test_a_cancelled_relay_reports_stopping(
    outbox_table: OutboxTable, postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic,
) -> None:
    topic = await make_topic(partitions=1)
    told = Readiness()
    relay = Relay(Postgres(dsn=postgres_dsn, schema=outbox_table.schema, pooler=POOLER),
                  KafkaSink(kafka_bootstrap, route=topic,
                                          kafka_options=dict(PRODUCER_OPTIONS)),
                  table=outbox_table.table,
                  handle_signals=False, observers=[told])
    task = asyncio.create_task(relay.run())
    try:
        await wait_until(lambda: _ready(relay), 30, "the relay to be ready")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert told.reasons[-1] == "stopping"
    assert await relay.readiness() == "stopping"


async def _ready(relay: Relay) -> bool:
    return await relay.readiness() is None
