"""Fixtures for outbox tests: a migrated outbox in a fresh schema, and helpers to read what
the relay published."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import asyncpg
import pytest_asyncio
from aiokafka import AIOKafkaConsumer

from consumerkit import migrate
from consumerkit.outbox import Outbox, OutboxTable, Relay
from tests.harness.from_zero import assign_from_zero, rewind


@pytest_asyncio.fixture(loop_scope="session")
async def outbox_table(pg_pool: asyncpg.Pool[asyncpg.Record], pg_schema: str) -> OutboxTable:
    table = OutboxTable(pg_schema, "outbox")
    async with pg_pool.acquire() as conn:
        await migrate(conn, dedup=None, outboxes=[table])
    return table


@pytest_asyncio.fixture(loop_scope="session")
async def outbox(outbox_table: OutboxTable) -> Outbox:
    return Outbox(outbox_table.schema, outbox_table.table)


@dataclass(frozen=True, slots=True)
class Published:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: dict[str, bytes]


async def wait_until(check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    """Poll ``check`` every 20 ms until it holds; fail with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


async def pending(pool: asyncpg.Pool[asyncpg.Record], table: OutboxTable) -> int:
    count: int = await pool.fetchval(f"SELECT count(*) FROM {table.events}")
    return count


async def read_all(bootstrap: str, topics: list[str], done: Callable[[list[Published]], bool],
                   timeout: float = 60) -> list[Published]:
    """Records of ``topics`` from offset 0, in log order, until ``done(records)`` holds, then
    until a poll finds nothing more (so late duplicates are counted too).

    The reader starts at offset 0, not at the beginning the broker names
    (:mod:`tests.harness.from_zero`). A broker can also show a later batch before an earlier
    one it has acknowledged (Tansu advances the high watermark before it writes the batch),
    and a plain reader passes that gap for good. So while what was read is incomplete, the
    reader goes back to 0 now and then, and keeps each record once by its position."""
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                              enable_auto_commit=False, metadata_max_age_ms=1000)
    await reader.start()
    found: dict[tuple[str, int, int], Published] = {}

    def in_order() -> list[Published]:
        return [found[k] for k in sorted(found)]

    try:
        async with asyncio.timeout(timeout):
            parts = await assign_from_zero(reader, topics)
            quiet, complete = 0, False
            rewound, interval = time.monotonic(), 1.0
            while quiet < 2:
                batch = await reader.getmany(timeout_ms=300)
                new = [r for records in batch.values() for r in records
                       if (r.topic, r.partition, r.offset) not in found]
                for r in new:
                    found[r.topic, r.partition, r.offset] = Published(
                        r.topic, r.partition, r.offset, r.key, r.value, r.timestamp,
                        dict(r.headers))
                if new:
                    quiet, complete = 0, done(in_order())
                elif complete:
                    quiet += 1
                elif time.monotonic() - rewound >= interval:
                    rewind(reader, parts)
                    rewound, interval = time.monotonic(), min(interval * 2, 8.0)
    except TimeoutError:  # say what was read, so a failure tells the broker from the relay
        per_partition = Counter((p.topic, p.partition) for p in found.values())
        raise AssertionError(
            f"reading {topics} for {timeout}s: {len(found)} records "
            f"({dict(per_partition)}), complete: {done(in_order())}") from None
    finally:
        await reader.stop()
    return in_order()


class RelayRunning:
    """``async with RelayRunning(relay):`` runs it in a task; on exit stops it and re-raises
    whatever ``run()`` raised."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Relay:
        self.task = asyncio.create_task(self.relay.run())
        started = asyncio.create_task(self.relay.started.wait())
        await asyncio.wait({self.task, started}, timeout=30,
                           return_when=asyncio.FIRST_COMPLETED)
        if self.task.done():
            started.cancel()
            self.task.result()
        assert started.done(), "relay did not start within 30s"
        return self.relay

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.relay.stop()
        async with asyncio.timeout(30):
            await self.task
