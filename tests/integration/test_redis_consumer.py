"""A consumer with the Redis cache, on a stream where half the records are duplicates, while
its Redis is flushed, or killed and later restarted: every effect exactly once (the ledger has
no unique constraint), the consumer keeps running, the cache counts its failures and comes
back. The Redis is the test's own; the shared one is never flushed."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import asyncpg
import pytest

from consumerkit import Consumer
from consumerkit.dedup.redis import RedisDedupCache

from .conftest import LedgerTopic
from .ledger import Event, Running, build, ledger_rows, publish, verify, wait_for
from .own_redis import REDIS_TIMEOUT, OwnRedis

WAIT = 60.0


@pytest.fixture
def own_redis() -> Iterator[OwnRedis]:
    server = OwnRedis()
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Feed:
    """Publishes batches and waits until the consumer has settled every record so far."""

    def __init__(self, consumer: Consumer, bootstrap: str, topic: str) -> None:
        self.consumer, self.bootstrap, self.topic = consumer, bootstrap, topic
        self.sent = 0

    async def send(self, events: Sequence[Event]) -> None:
        await publish(self.bootstrap, self.topic, events)
        self.sent += len(events)

    async def settled(self, at_least: int | None = None) -> None:
        target = self.sent if at_least is None else at_least
        s = self.consumer.stats

        async def done() -> bool:
            return s.applied + s.duplicates + s.dead_lettered + s.expired_skipped >= target

        await wait_for(done, WAIT, f"{target} records settled")

    @property
    def outcomes(self) -> int:
        s = self.consumer.stats
        return s.applied + s.duplicates + s.dead_lettered + s.expired_skipped


def make_events(keys: int, per_key: int, prefix: str) -> list[Event]:
    """Like ledger.make_events, with keys of their own per prefix (the ledger checks the
    sequence per key)."""
    return [Event(f"{prefix}-{k}-{s}", f"{prefix}-key-{k}", s)
            for s in range(1, per_key + 1) for k in range(keys)]


async def _exact(pool: asyncpg.Pool, schema: str, expected: Sequence[Event],
                 consumer: Consumer) -> None:
    async with pool.acquire() as conn:
        verify(await ledger_rows(conn, schema), expected)
    assert consumer.stats.applied == len(expected)
    assert consumer.stats.dead_lettered == 0


async def test_a_flushed_redis_loses_nothing(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    pg_pool: asyncpg.Pool, own_redis: OwnRedis,
) -> None:
    topic = await ledger_topic(partitions=4)
    cache = RedisDedupCache(own_redis.url, socket_timeout=REDIS_TIMEOUT)
    consumer = build("redis-flush", pg_schema, topic, postgres_dsn, kafka_bootstrap,
                     dedup_cache=cache)
    cache.check(consumer.dedup)
    a, b = make_events(20, 15, "a"), make_events(20, 15, "b")
    async with Running(consumer):
        feed = Feed(consumer, kafka_bootstrap, topic)
        await feed.send(a)
        await feed.settled()
        await feed.send([*a, *b, *b])  # half of the stream are duplicates
        await feed.settled(feed.outcomes + 100)
        own_redis.client().flushall()  # mid-run (or just after it, on a fast machine)
        await feed.settled()
        # applied after the flush: the cache knows c's ids whatever the flush caught
        c = make_events(20, 5, "c")
        await feed.send(c)
        await feed.settled()
        hits_before = cache.hits
        await feed.send([*a, *b, *c])  # all duplicates, and the cache refilled since
        await feed.settled()
        assert cache.hits >= hits_before + len(c)
        assert cache.failures == 0  # a flush only makes misses
    await _exact(pg_pool, pg_schema, [*a, *b, *c], consumer)
    assert consumer.stats.duplicates == feed.sent - len(a) - len(b) - len(c)


async def test_a_killed_redis_loses_nothing_and_the_cache_comes_back(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    pg_pool: asyncpg.Pool, own_redis: OwnRedis,
) -> None:
    topic = await ledger_topic(partitions=4)
    cache = RedisDedupCache(own_redis.url, retry_interval=0.2, socket_timeout=REDIS_TIMEOUT)
    consumer = build("redis-kill", pg_schema, topic, postgres_dsn, kafka_bootstrap,
                     dedup_cache=cache)
    cache.check(consumer.dedup)
    a, b = make_events(20, 10, "a"), make_events(20, 10, "b")
    async with Running(consumer) as running:
        feed = Feed(consumer, kafka_bootstrap, topic)
        await feed.send(a)
        await feed.settled()
        await feed.send(a)
        await feed.settled()
        assert cache.hits == len(a)  # every duplicate answered by the cache

        await feed.send([*b, *a, *b])  # half duplicates
        await feed.settled(feed.outcomes + 50)
        own_redis.kill()  # mid-run
        await feed.settled()
        await feed.send([*a, *b])  # duplicates while Redis is dead: PostgreSQL answers
        await feed.settled()
        assert cache.failures >= 1
        assert cache.breaker_opens == 1
        assert not cache.available
        assert running is consumer

        own_redis.start()  # the same port, empty
        extra: list[Event] = []

        async def back() -> bool:
            more = make_events(5, 1, f"c{len(extra)}")
            extra.extend(more)
            await feed.send(more)
            await feed.settled()
            return cache.available

        await wait_for(back, WAIT, "the cache to reconnect")
        assert cache.recoveries == 1
        d = make_events(10, 5, "d")
        await feed.send(d)
        await feed.settled()
        hits_before = cache.hits
        await feed.send(d)
        await feed.settled()
        assert cache.hits == hits_before + len(d)  # remembered again after the restart
    await _exact(pg_pool, pg_schema, [*a, *b, *extra, *d], consumer)
