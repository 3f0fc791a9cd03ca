"""A webhook receiver reports its outcomes to observers: its deliveries as metrics."""

from __future__ import annotations

import uuid

import asyncpg
import httpx
import orjson
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from consumerkit.observability.metrics import ConsumerMetrics

from ..webhooks.handlers import create_effects, order_id, receiving
from .scrape import value


async def test_applied_and_duplicate_deliveries_are_counted(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool[asyncpg.Record],
) -> None:
    await create_effects(pg_pool, pg_schema)
    registry = CollectorRegistry()
    key = str(uuid.uuid4())
    content = orjson.dumps({"order_id": order_id(), "amount": 5})
    sent = {"Idempotency-Key": key, "X-Event-Type": "order.paid"}
    metrics = ConsumerMetrics(registry, "partner")
    async with (receiving(postgres_dsn, pg_schema, "partner", observers=[metrics]) as url,
                httpx.AsyncClient(base_url=url, timeout=20) as client):
        first = await client.post("/orders", content=content, headers=sent)
        second = await client.post("/orders", content=content, headers=sent)
    assert (first.json()["status"], second.json()["status"]) == ("applied", "duplicate")
    body = generate_latest(registry).decode()
    found = {(s.name, frozenset(s.labels.items())): s.value
             for family in text_string_to_metric_families(body) for s in family.samples}
    total = "consumerkit_messages_total"
    assert value(found, total, consumer="partner", topic="webhook:/orders",
                 outcome="applied") == 1
    assert value(found, total, outcome="duplicate") == 1
    assert value(found, "consumerkit_duplicate_age_seconds_count", consumer="partner") == 1
