"""A webhook receiver reports its outcomes to observers: its deliveries as metrics."""

from __future__ import annotations

import uuid
from datetime import datetime

import asyncpg
import httpx
import orjson
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from consumerkit.envelope import Envelope, RecordLike
from consumerkit.observability import BaseObserver
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
    assert value(found, total, consumer="partner", topic="webhook:partner",
                 outcome="applied") == 1
    assert value(found, total, outcome="duplicate") == 1
    assert value(found, "consumerkit_duplicate_age_seconds_count", consumer="partner") == 1


class RaisesOnOutcomes(BaseObserver):
    def applied(self, record: RecordLike, envelope: Envelope, handler: str) -> None:
        raise RuntimeError("a bug in the observer")

    def duplicate(self, record: RecordLike, envelope: Envelope | None, handler: str,
                  original_seen_at: datetime | None) -> None:
        raise RuntimeError("a bug in the observer")


async def test_an_observer_that_raises_does_not_turn_an_applied_delivery_into_an_error(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool[asyncpg.Record],
) -> None:
    """The effect committed: the sender must hear so, or it sends again for nothing."""
    await create_effects(pg_pool, pg_schema)
    content = orjson.dumps({"order_id": order_id(), "amount": 5})
    sent = {"Idempotency-Key": str(uuid.uuid4()), "X-Event-Type": "order.paid"}
    async with (receiving(postgres_dsn, pg_schema, "partner",
                          observers=[RaisesOnOutcomes()]) as url,
                httpx.AsyncClient(base_url=url, timeout=20) as client):
        first = await client.post("/orders", content=content, headers=sent)
        second = await client.post("/orders", content=content, headers=sent)
    assert (first.status_code, first.json()["status"]) == (200, "applied")
    assert second.json()["status"] == "duplicate"
    count = await pg_pool.fetchval(f"SELECT count(*) FROM {pg_schema}.effects")
    assert count == 1


async def test_topic_labels_stay_bounded_whatever_the_path(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool[asyncpg.Record],
) -> None:
    """The request path is the caller's choice: as a label value it would grow without bound.
    Only a path a handler routes on becomes a topic; any other is the namespace."""
    await create_effects(pg_pool, pg_schema)
    registry = CollectorRegistry()
    metrics = ConsumerMetrics(registry, "partner")
    async with (receiving(postgres_dsn, pg_schema, "partner", observers=[metrics]) as url,
                httpx.AsyncClient(base_url=url, timeout=20) as client):
        for path in [f"/x/{uuid.uuid4()}" for _ in range(3)]:
            reply = await client.post(path, content=orjson.dumps(
                {"order_id": order_id(), "amount": 5}), headers={
                    "Idempotency-Key": str(uuid.uuid4()), "X-Event-Type": "order.paid"})
            assert reply.json()["status"] == "applied"
        reply = await client.post("/legacy", content=orjson.dumps(  # routed by its path
            {"order_id": order_id(), "amount": 5}), headers={"Idempotency-Key": str(uuid.uuid4())})
        assert reply.json()["status"] == "applied"
    families = text_string_to_metric_families(generate_latest(registry).decode())
    topics = {s.labels["topic"] for family in families for s in family.samples
              if s.name == "consumerkit_messages_total"}
    assert topics == {"webhook:partner", "webhook:/legacy"}
