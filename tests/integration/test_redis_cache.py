"""The Redis "seen" cache on a Redis of the test's own: one round trip per call (also after a
restart lost its scripts), a circuit
breaker that makes a dead or stalled Redis cost nothing, recovery, no secret in the logs."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta

import pytest

from consumerkit.dedup import DedupPolicy
from consumerkit.dedup.redis import RedisDedupCache
from consumerkit.errors import ConfigurationError

from .ledger import wait_for
from .own_redis import OwnRedis

NS = "billing"


@pytest.fixture
def own_redis() -> Iterator[OwnRedis]:
    server = OwnRedis()
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def test_known_and_remember_round_trip(own_redis: OwnRedis) -> None:
    cache = RedisDedupCache(own_redis.url, ttl=timedelta(minutes=5))
    await cache.open()
    try:
        long_id = "x" * 200
        assert await cache.known(NS, ["a", "b", long_id]) == set()
        await cache.remember(NS, ["a", long_id])
        assert await cache.known(NS, ["a", "b", long_id]) == {"a", long_id}
        assert await cache.known("shipping", ["a"]) == set()
        assert (cache.hits, cache.misses, cache.failures) == (2, 5, 0)
        client = own_redis.client()
        keys = sorted(client.keys("*"))
        assert keys == sorted([b"consumerkit:seen:billing:a", cache.key(NS, long_id)])
        assert cache.key(NS, long_id).startswith(b"consumerkit:seen:billing:sha256:")
        odd = ["", "line\nbreak", "ünï-cødé", "sha256:" + "0" * 64, "a b:c"]
        await cache.remember(NS, odd[:3])
        assert await cache.known(NS, [*odd, "line"]) == set(odd[:3])
        assert len(client.keys("*")) == 5
        # an id that looks like a hashed key is hashed too: no two ids share a key
        assert cache.key(NS, "sha256:" + "0" * 64) != b"consumerkit:seen:billing:sha256:" + (
            b"0" * 64)
        assert 0 < client.pttl(b"consumerkit:seen:billing:a") <= 300_000
        commands = client.info("commandstats")
        assert commands["cmdstat_evalsha"]["calls"] == 6  # one round trip per call
        assert "cmdstat_mget" not in commands
        client.close()
    finally:
        await cache.close()


async def test_many_concurrent_calls_share_few_round_trips_and_connections(
    own_redis: OwnRedis,
) -> None:
    """1,000 lanes asking at once (a consumer with ``max_batch=1``) would need 1,000
    connections one call each; redis-py's pool refuses past 100, which used to open the
    breaker and turn the cache off under load."""
    cache = RedisDedupCache(own_redis.url, ttl=timedelta(minutes=5))
    await cache.open()
    try:
        await cache.remember(NS, [f"e-{i}" for i in range(0, 1000, 2)])
        client = own_redis.client()
        client.config_resetstat()
        answers = await asyncio.gather(*(cache.known(NS, [f"e-{i}"]) for i in range(1000)))
        assert answers == [{f"e-{i}"} if i % 2 == 0 else set() for i in range(1000)]
        await asyncio.gather(*(cache.remember(NS, [f"e-{i}"]) for i in range(1, 1000, 2)))
        assert (cache.failures, cache.breaker_opens, cache.available) == (0, 0, True)
        assert await cache.known(NS, [f"e-{i}" for i in range(1000)]) == {
            f"e-{i}" for i in range(1000)}
        calls = client.info("commandstats")["cmdstat_evalsha"]["calls"]
        assert calls <= 10, f"{calls} round trips for 2,001 calls"
        assert client.info("clients")["connected_clients"] <= 4  # 2 of the cache + this one
        client.close()
    finally:
        await cache.close()


def test_the_ttl_is_checked_against_the_retention() -> None:
    policy = DedupPolicy(retention=timedelta(hours=6), partition_interval=timedelta(hours=6))
    default = RedisDedupCache("redis://127.0.0.1:1/0")
    assert default.ttl == timedelta(days=1)
    default.check(policy)
    assert default.ttl == timedelta(hours=6)  # lowered to the retention
    RedisDedupCache("redis://127.0.0.1:1/0", ttl=timedelta(hours=6)).check(policy)
    with pytest.raises(ConfigurationError, match="longer than the dedup retention"):
        RedisDedupCache("redis://127.0.0.1:1/0", ttl=timedelta(hours=7)).check(policy)
    with pytest.raises(ConfigurationError, match="Redis URL"):
        RedisDedupCache("http://127.0.0.1:1/0")


async def test_a_dead_redis_opens_the_breaker_and_costs_nothing_until_it_is_back(
    own_redis: OwnRedis, caplog: pytest.LogCaptureFixture,
) -> None:
    cache = RedisDedupCache(own_redis.url, retry_interval=0.3)
    await cache.open()
    try:
        await cache.remember(NS, ["a"])
        own_redis.kill()
        with caplog.at_level(logging.WARNING, "consumerkit.dedup"):
            assert await cache.known(NS, ["a"]) == set()  # the failure answers "unknown"
            assert (cache.failures, cache.breaker_opens, cache.available) == (1, 1, False)
            started = time.perf_counter()
            for _ in range(100):
                assert await cache.known(NS, ["a"]) == set()
                await cache.remember(NS, ["a"])
            assert time.perf_counter() - started < 0.05  # the open breaker sends nothing
            assert cache.bypassed == 200
            assert cache.failures == 1
            # periodic attempts while it stays dead: failures grow, one warning only
            await wait_for(_probed(cache, failures=3), 10, "two more attempts")
            assert cache.breaker_opens == 1

            own_redis.start()  # same port, empty
            await wait_for(_probed(cache, available=True), 10, "the cache to come back")
        assert cache.recoveries == 1
        failures_when_back = cache.failures
        warnings = [r.getMessage() for r in caplog.records if r.name == "consumerkit.dedup"]
        assert len(warnings) == 2, warnings
        assert "unavailable" in warnings[0]
        assert "is back" in warnings[1]
        await cache.remember(NS, ["b"])  # the scripts are loaded again by themselves
        assert await cache.known(NS, ["a", "b"]) == {"b"}  # "a" went with the old process
        assert cache.failures == failures_when_back
    finally:
        await cache.close()


async def test_a_redis_back_after_a_restart_serves_every_pooled_connection(
    own_redis: OwnRedis,
) -> None:
    """The pool's idle connections went with the killed server: used after the recovery, each
    failed once and opened the breaker again (a consumer's cache went off for another
    retry interval after saying it was back)."""
    cache = RedisDedupCache(own_redis.url, retry_interval=0.2)
    await cache.open()
    try:
        await asyncio.gather(cache.known(NS, ["a"]), cache.remember(NS, ["a"]))
        client = own_redis.client()
        assert client.info("clients")["connected_clients"] == 3  # two pooled, and this one
        client.close()
        own_redis.kill()
        assert await cache.known(NS, ["a"]) == set()
        assert (cache.breaker_opens, cache.available) == (1, False)
        own_redis.start()  # same port, empty
        await wait_for(_probed(cache, available=True), 10, "the cache to come back")
        for n in range(3):
            await asyncio.gather(cache.known(NS, [f"b{n}"]), cache.remember(NS, [f"b{n}"]))
        assert (cache.breaker_opens, cache.recoveries, cache.available) == (1, 1, True)
        assert await cache.known(NS, ["b0", "b1", "b2"]) == {"b0", "b1", "b2"}
    finally:
        await cache.close()


async def test_a_probe_given_up_before_it_was_sent_does_not_keep_the_cache_off(
    own_redis: OwnRedis,
) -> None:
    """While Redis is away one call at a time may try it. A lane cancelled (a revocation, a
    shutdown) while its call waited to be sent must leave the next call free to try, or the
    cache would stay off for good."""
    cache = RedisDedupCache(own_redis.url, retry_interval=0.2)
    await cache.open()
    try:
        own_redis.kill()
        assert await cache.known(NS, ["a"]) == set()
        assert cache.breaker_opens == 1

        async def retry_due() -> bool:
            return time.monotonic() >= cache._retry_at

        await wait_for(retry_due, 10, "the retry interval to pass")
        given_up = asyncio.create_task(cache.known(NS, ["a"]))  # admitted as the probe
        await asyncio.sleep(0)
        given_up.cancel()
        with pytest.raises(asyncio.CancelledError):
            await given_up
        own_redis.start()
        await wait_for(_probed(cache, available=True), 10, "the cache to come back")
        assert cache.recoveries == 1
    finally:
        await cache.close()


async def test_a_closed_cache_answers_nothing_known_to_calls_still_waiting(
    own_redis: OwnRedis,
) -> None:
    """Another consumer closing a shared cache must not cancel this one's calls."""
    cache = RedisDedupCache(own_redis.url, socket_timeout=2.0)
    await cache.open()
    own_redis.pause()
    try:
        calls = [asyncio.create_task(cache.known(NS, [f"e-{i}"])) for i in range(3)]
        await asyncio.sleep(0)
        await cache.close()
        assert await asyncio.gather(*calls) == [set(), set(), set()]
        await cache.remember(NS, ["e-0"])  # closed: nothing sent, nothing raised
    finally:
        own_redis.resume()


async def test_a_stalled_redis_costs_one_socket_timeout(own_redis: OwnRedis) -> None:
    cache = RedisDedupCache(own_redis.url, socket_timeout=0.05, retry_interval=0.2)
    await cache.open()
    try:
        assert await cache.known(NS, ["a"]) == set()
        own_redis.pause()
        started = time.perf_counter()
        assert await cache.known(NS, ["a"]) == set()
        assert time.perf_counter() - started < 0.5  # bounded by 2 x socket_timeout + slack
        assert (cache.failures, cache.breaker_opens) == (1, 1)
        own_redis.resume()
        await wait_for(_probed(cache, available=True), 10, "the cache to answer again")
        await cache.remember(NS, ["a"])
        assert await cache.known(NS, ["a"]) == {"a"}
    finally:
        own_redis.resume()
        await cache.close()


async def test_an_unreachable_redis_at_start_is_no_error_and_no_secret_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = OwnRedis(password="s3cret-pw")
    server.start()
    url = server.url
    server.stop()  # nothing listens there any more
    cache = RedisDedupCache(url, retry_interval=60)
    with caplog.at_level(logging.INFO, "consumerkit.dedup"):
        await cache.open()
        assert await cache.known(NS, ["a"]) == set()
        await cache.close()
    assert (cache.available, cache.breaker_opens, cache.bypassed) == (False, 1, 1)
    assert "s3cret-pw" not in caplog.text
    assert "***" in caplog.text
    assert "s3cret-pw" not in repr(cache)


def _probed(cache: RedisDedupCache, *, failures: int | None = None,
            available: bool | None = None) -> Callable[[], Awaitable[bool]]:
    """A condition for wait_for that also drives the breaker: each check asks the cache once
    (an attempt goes to Redis only once the retry interval has passed)."""
    async def check() -> bool:
        await cache.known(NS, ["probe"])
        await asyncio.sleep(0.02)
        if failures is not None:
            return cache.failures >= failures
        return cache.available is available

    return check
