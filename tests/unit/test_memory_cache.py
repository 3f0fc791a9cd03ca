"""MemoryDedupCache's own limits: its size, its time to live, its check against the policy."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest

from consumerkit import ConfigurationError, DedupPolicy, MemoryDedupCache


async def test_the_oldest_ids_are_forgotten_beyond_max_ids() -> None:
    cache = MemoryDedupCache(max_ids=3)
    await cache.open()
    await cache.remember("ns", ["a", "b", "c"])
    await cache.remember("ns", ["a"])  # remembered again: now the newest
    await cache.remember("ns", ["d"])
    assert await cache.known("ns", ["a", "b", "c", "d"]) == {"a", "c", "d"}
    assert await cache.known("other", ["a"]) == set()  # namespaces apart
    assert (cache.hits, cache.misses) == (3, 2)


async def test_an_id_is_forgotten_after_the_ttl() -> None:
    cache = MemoryDedupCache(ttl=timedelta(milliseconds=50))
    await cache.open()
    await cache.remember("ns", ["a"])
    assert await cache.known("ns", ["a"]) == {"a"}
    deadline = time.monotonic() + 5
    while await cache.known("ns", ["a"]) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert await cache.known("ns", ["a"]) == set()


def test_the_ttl_never_outlives_the_retention() -> None:
    policy = DedupPolicy(retention=timedelta(days=2))
    default = MemoryDedupCache()
    default.check(policy)
    assert default.ttl == timedelta(hours=1)  # the default, shorter than the retention
    with pytest.raises(ConfigurationError, match="longer than the dedup retention"):
        MemoryDedupCache(ttl=timedelta(days=3)).check(policy)
    with pytest.raises(ConfigurationError, match="max_ids"):
        MemoryDedupCache(max_ids=0)
