"""The pizza shop's run: three waves of orders, copies injected, two processes SIGKILLed.

1. A tenth of wave A is placed; once billing has charged an order, the rest of wave A is
   placed, and when billing has charged a third of it, the billing consumer is SIGKILLed and
   restarted (its uncommitted deliveries come again, and are absorbed).
2. Once wave A is published, copies of a quarter of its events are added to the outbox again
   with the same event ids (what a re-publish does); wave B is placed, and as soon as the
   orders relay has published part of it, that relay is SIGKILLed and restarted (the batch it
   had sent may be sent again).
3. Copies of wave B, then wave C and its copies. On a Kafka cluster (``faults``), once the
   orders relay has published part of wave C, the broker leading the most partitions of the
   orders topic is SIGKILLed and started again; the run checks it rejoins the cluster.
   The run is done when the database holds every charge, reservation and payment and every
   event applied, and the consumers have absorbed every copy; every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from ..errors import ConsumerKitError
from ..outbox import NewEvent
from . import shop
from .broker import BrokerFaults
from .procs import Workers
from .report import Counts, Kill, read_counts
from .view import Progress

POLL = 0.05
COPY_SHARE = 0.25
WRITERS = 4  # connections placing orders at once


class DemoFailed(ConsumerKitError):
    """The run could not finish: a deadline passed or a worker died by itself."""


@dataclass(slots=True)
class Scenario:
    orders: int
    schema: str
    pool: asyncpg.Pool
    workers: Workers
    view: Progress
    timeout: float
    faults: BrokerFaults | None = None  # a cluster one broker of which is killed in wave C
    topic: str = ""  # the orders topic, and its partitions
    partitions: int = 1
    rng: random.Random = field(default_factory=lambda: random.Random(7))
    kills: list[Kill] = field(default_factory=list)
    counts: Counts = field(default_factory=Counts)
    roles_reporting: int = 0

    async def run(self) -> None:
        size = -(-self.orders // 3)
        waves = [range(i, min(i + size, self.orders)) for i in range(0, self.orders, size)]
        waves += [range(0)] * (3 - len(waves))
        await self._wait("starting 3 consumers and 2 relays, each a process",
                         lambda c: self.roles_reporting == 5)
        first = waves[0][:max(1, len(waves[0]) // 10)]
        written = await self._place(first, "placing the first orders of wave A")
        await self._wait("waiting for billing's first charge", lambda c: c.charges >= 1)
        placing = asyncio.create_task(self._place(waves[0][len(first):], "placing wave A"))
        await self._wait("waiting for billing to charge a third of wave A",
                         lambda c: c.charges >= max(1, len(waves[0]) // 3))
        await self._kill("billing", "billing consumer",
                         f"{self.counts.charges} of {len(waves[0])} wave A orders charged")
        written += await placing
        await self._wait("publishing wave A", lambda c: c.shop_pending == 0)
        await self._inject(written)
        placing = asyncio.create_task(self._place(waves[1], "placing wave B"))
        published = self.counts.published
        await self._wait("waiting for the orders relay to publish wave B",
                         lambda c: c.published > published or placing.done())
        await self._kill("relay-shop", "orders relay",
                         f"{self.counts.shop_pending} order events pending")
        written = await placing
        await self._wait("publishing wave B", lambda c: c.shop_pending == 0)
        await self._inject(written)
        placing = asyncio.create_task(self._place(waves[2], "placing wave C"))
        rejoined = None
        try:
            if self.faults is not None:
                published = self.counts.published
                await self._wait("waiting for the orders relay to publish wave C",
                                 lambda c: c.published > published or placing.done())
                rejoined = await self._kill_broker(self.faults)
            written = await placing
            await self._wait("publishing wave C", lambda c: c.shop_pending == 0)
            await self._inject(written)
            await self._wait("finishing: charges, reservations, payments, duplicates",
                             lambda c: c.done(self.orders))
            if rejoined is not None:
                self.kills.append(await rejoined)
        finally:
            for task in (placing, rejoined):
                if task is not None and not task.done():
                    task.cancel()

    async def refresh(self) -> Counts:
        async with self.pool.acquire() as conn:
            self.counts = await read_counts(conn, self.schema)
            self.roles_reporting = await conn.fetchval(
                f"SELECT count(DISTINCT role) FROM {self.schema}.workers")
        return self.counts

    async def _wait(self, phase: str, condition: Callable[[Counts], bool]) -> None:
        deadline = time.monotonic() + self.timeout
        self.view.update(self.counts, phase)
        while True:
            counts = await self.refresh()
            self.view.update(counts)
            if condition(counts):
                return
            failed = self.workers.failed()
            if failed:
                raise DemoFailed(f"{failed} while {phase}")
            if time.monotonic() > deadline:
                raise DemoFailed(f"no progress for {self.timeout:g}s while {phase}")
            await asyncio.sleep(POLL)

    async def _place(self, numbers: range, phase: str) -> list[tuple[Any, NewEvent]]:
        """The orders service: each order and its events in one transaction."""
        self.view.update(self.counts, phase)
        outbox = shop.shop_outbox(self.schema)
        orders = [shop.random_order(self.rng, n) for n in numbers]
        written: list[tuple[Any, NewEvent]] = []

        async def writer(share: list[shop.Order]) -> None:
            async with self.pool.acquire() as conn:
                for order in share:
                    written.extend(await shop.place_order(conn, outbox, self.schema, order))
                    await asyncio.sleep(0)

        await asyncio.gather(*(writer(orders[i::WRITERS]) for i in range(WRITERS)))
        return written

    async def _inject(self, written: list[tuple[Any, NewEvent]]) -> None:
        """Add copies of a share of these (already published) events, with the same ids."""
        if not written:
            return
        picked = self.rng.sample(written, max(1, int(len(written) * COPY_SHARE)))
        copies = [NewEvent(e.event_type, e.aggregate_type, e.aggregate_id, e.payload,
                           event_id=event_id) for event_id, e in picked]
        async with self.pool.acquire() as conn, conn.transaction():
            await shop.shop_outbox(self.schema).add_many(conn, copies)
            await conn.executemany(f"INSERT INTO {self.schema}.injected VALUES ($1)",
                                   [(event_id,) for event_id, _ in picked])
        self.view.note(f"injected {len(copies)} copies of published events (same event ids)")

    async def _kill_broker(self, faults: BrokerFaults) -> asyncio.Task[Kill]:
        """SIGKILL the busiest broker and start it again; the task gives its line once the
        broker is back in the cluster's metadata (or why it is not)."""
        await self.refresh()
        pending = self.counts.shop_pending
        killed = await faults.kill_busiest(self.topic, self.partitions)
        at = time.monotonic() - self.view.started
        process = f"Kafka broker {killed.node_id}"
        when = (f"leader of {killed.led} of the orders topic's {killed.partitions} partitions,"
                f" {pending} order events pending")
        self.view.note(f"SIGKILL {process} (pid {killed.pid}): {when}")
        self.view.note(f"restarted {process} as pid {killed.restarted_pid}")

        async def back() -> Kill:
            failed = await faults.rejoined(killed.node_id)
            after = "back in the cluster's metadata" if failed is None else f"NOT BACK: {failed}"
            self.view.note(f"{process} {after}")
            return Kill(process, killed.pid, at, when, killed.restarted_pid, after,
                        failed is None)

        return asyncio.create_task(back())

    async def _kill(self, role: str, process: str, when: str) -> None:
        await self.refresh()
        pid = await asyncio.to_thread(self.workers.kill, role)
        at = time.monotonic() - self.view.started
        self.view.note(f"SIGKILL {process} (pid {pid}): {when}")
        new_pid = self.workers.start(role)
        self.kills.append(Kill(process, pid, at, when, new_pid))
        self.view.note(f"restarted {process} as pid {new_pid}")
