"""The consumer's view of its parked keys on a real PostgreSQL: loaded when a partition is
assigned, answered from memory, forgotten when it is revoked, and counted in the gauges for
the partitions it owns only."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from consumerkit import migrate
from consumerkit.envelope import Record
from consumerkit.observability.observer import BaseObserver
from consumerkit.parking import store
from consumerkit.parking.lot import ParkingLot
from consumerkit.transport.source import Partition

from .test_store import entry


class Gauges(BaseObserver):
    def __init__(self) -> None:
        self.last: tuple[int, int] | None = None

    def parking(self, keys: int, records: int) -> None:
        self.last = (keys, records)


async def test_parked_keys_load_on_assignment_and_count_for_owned_partitions_only(
    pg_pool: asyncpg.Pool, pg_schema: str,
) -> None:
    async with pg_pool.acquire() as conn:
        await migrate(conn, pg_schema)
        await store.park(conn, pg_schema, [entry(7, reason="handler_failed"), entry(8)],
                         start=True)
    gauges = Gauges()
    lot = ParkingLot(pg_pool, pg_schema, "billing", gauges)
    lot.assigned([("orders", 3)])
    parked = Record("orders", 3, 9, b"order-1", b"{}")
    flowing = Record("orders", 3, 10, b"order-2", b"{}")
    assert await lot.holds(parked)
    assert not await lot.holds(flowing)
    assert gauges.last == (1, 2)
    # another process discards the key: the next record finds it gone and is applied
    async with pg_pool.acquire() as conn:
        (key,) = await store.list_keys(conn, pg_schema, "billing")
        assert await store.discard(conn, pg_schema, key) == 2
    assert await lot.park([(parked, None)], reason="key_parked", detail="", attempts=0,
                          start=False) is False
    assert not await lot.holds(parked)
    assert gauges.last == (0, 0)
    # a record of a revoked partition is answered from the database, not counted
    async with pg_pool.acquire() as conn:
        await store.park(conn, pg_schema, [entry(11, reason="handler_failed")], start=True)
    lot.revoked([("orders", 3)])
    assert await lot.holds(parked)
    assert gauges.last == (0, 0)
    # assigned again: loaded afresh, and refreshed from the database
    lot.assigned([("orders", 3)])
    assert await lot.holds(parked)
    async with pg_pool.acquire() as conn:
        await store.park(conn, pg_schema, [entry(12, key=b"order-3", reason="handler_failed")],
                         start=True)
    await lot.refresh()
    assert gauges.last == (2, 2)
    assert await lot.holds(Record("orders", 3, 13, b"order-3", b"{}"))


async def test_a_load_that_outlived_its_ownership_leaves_the_next_one_s_keys(
    pg_pool: asyncpg.Pool, pg_schema: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Revoked while its parked keys were read, then assigned again after another owner parked
    a key: the first read, answered last, must not replace what the second read found."""
    async with pg_pool.acquire() as conn:
        await migrate(conn, pg_schema)
    read, answer = asyncio.Event(), asyncio.Event()
    real = store.parked_keys
    calls = 0

    async def first_held(*args: Any) -> dict[Partition, dict[bytes, int]]:
        nonlocal calls
        calls += 1
        found = await real(*args)
        if calls == 1:  # read, and answered once the test says so
            read.set()
            await answer.wait()
        return found

    monkeypatch.setattr(store, "parked_keys", first_held)
    lot = ParkingLot(pg_pool, pg_schema, "billing", Gauges())
    part: Partition = ("orders", 3)
    lot.assigned([part])
    first = lot._loading[part]
    await asyncio.wait_for(read.wait(), 30)  # nothing parked yet, as it read
    lot.revoked([part])
    async with pg_pool.acquire() as conn:  # the partition's owner meanwhile parks a key
        await store.park(conn, pg_schema, [entry(7, reason="handler_failed")], start=True)
    lot.assigned([part])
    record = Record("orders", 3, 8, b"order-1", b"{}")
    assert await lot.holds(record)
    answer.set()
    await asyncio.wait_for(first, 30)
    assert lot.holds_now(record)
