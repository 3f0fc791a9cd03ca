"""The dedup cache's answers as metrics: hits for duplicates of committed events, misses for
new ones, errors while Redis is away."""

from __future__ import annotations

import uuid

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from consumerkit.dedup import RedisDedupCache
from consumerkit.testing.services import free_port

from ..integration.conftest import LedgerTopic
from ..integration.ledger import Event, Running, build, make_events, publish, settled
from ..integration.ledger import wait_for as wait
from ..integration.own_redis import REDIS_TIMEOUT
from .scrape import value


async def test_cache_hits_misses_and_errors_are_counted(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    redis_url: str,
) -> None:
    topic = await ledger_topic(partitions=1)
    events = make_events(keys=3, per_key=2)
    await publish(kafka_bootstrap, topic, events)
    registry = CollectorRegistry()
    cache = RedisDedupCache(redis_url, prefix=f"test:{uuid.uuid4().hex}",
                             socket_timeout=REDIS_TIMEOUT)
    consumer = build("cache", pg_schema, topic, postgres_dsn, kafka_bootstrap,
                     dedup_cache=cache, registry=registry)
    async with Running(consumer):
        await wait(lambda: settled(consumer, len(events)), 60, "originals settled")
        again = [Event(e.event_id, e.key, e.seq) for e in events[:4]]
        await publish(kafka_bootstrap, topic, again)
        await wait(lambda: settled(consumer, len(events) + len(again)), 60, "duplicates")
    found = _samples(registry)
    name = "consumerkit_dedup_cache_requests_total"
    assert value(found, name, result="hit") == len(again) == cache.hits
    misses = value(found, name, result="miss")
    assert misses == cache.misses
    assert misses is not None
    assert misses >= len(events)
    assert value(found, name, result="error") == 0

    # Redis away (nothing listens): every id asked is an error, neither a hit nor a miss
    away = RedisDedupCache(f"redis://127.0.0.1:{free_port()}/0", socket_timeout=0.05)
    counts: list[tuple[int, int, int]] = []
    away.on_lookup = lambda *c: counts.append(c)
    await away.open()
    try:
        assert await away.known("ns", ["a", "b"]) == set()
    finally:
        await away.close()
    assert counts == [(0, 0, 2)]


def _samples(registry: CollectorRegistry) -> dict[tuple[str, frozenset[tuple[str, str]]],
                                                  float]:
    body = generate_latest(registry).decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}
