"""The consumer's parked keys: loaded per partition when it is assigned, checked per record in
memory, added to when a record is parked.

Only this consumer parks records of the partitions it owns, so what it loaded plus what it
parked since is the truth, but for keys that a replay or a discard (another process) removed:
the next record of such a key finds the key's row gone when it tries to join the park, and is
applied normally. A periodic refresh also forgets them, and keeps the gauges right.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import asyncpg

from ..deadletter.writer import wait_or_abandon
from ..envelope import RecordLike
from ..errors import StartupError
from ..observability.observer import Observer
from ..retry import RetryPolicy
from ..route_table import RouteTable
from ..shared.failures import describe, judge
from . import store
from .entry import ParkedRecord

if TYPE_CHECKING:  # the engine imports the lot: only the decoded record's type comes back
    from ..engine.decode import Decoded

log = logging.getLogger("consumerkit.parking")

Partition = tuple[str, int]

_OUTAGE_RETRY = RetryPolicy(max_attempts=1, initial_delay=0.2, max_delay=5.0)
FOLLOWER = ("key_parked", "an earlier record of its key could not be applied", 0)


class ParkingLot:
    """Parked keys of the partitions a consumer owns, and the way to park more records."""

    def __init__(self, pool: asyncpg.Pool, schema: str, consumer: str,
                 observer: Observer) -> None:
        self.pool = pool
        self.schema = schema
        self.consumer = consumer
        self.observe = observer
        self._keys: dict[Partition, dict[bytes, int]] = {}  # key -> records waiting
        self._loading: dict[Partition, asyncio.Task[dict[bytes, int]]] = {}
        self._changes: dict[Partition, int] = {}  # parks and unparks seen, per partition
        self._owned: set[Partition] = set()  # assigned and not revoked since

    async def check(self) -> None:
        """Refuse to start (:class:`~consumerkit.errors.StartupError`) without the tables."""
        async with self.pool.acquire() as conn:
            missing = await store.missing_tables(conn, self.schema)
        if missing:
            raise StartupError(
                f"on_exhausted='park' needs the table {self.schema}.{missing}: run "
                "consumerkit migrate (or start once with migrate=True)")

    # -- ownership ----------------------------------------------------------------------------

    def assigned(self, partitions: Iterable[Partition]) -> None:
        """Start loading the parked keys of ``partitions``; their records wait for it."""
        for part in partitions:
            self._owned.add(part)
            self._keys.pop(part, None)
            self._loading.pop(part, None)
            self._start_loading(part)

    def revoked(self, partitions: Iterable[Partition]) -> None:
        for part in partitions:
            # a load still running is left to end by itself: records of the partition may be
            # waiting for it, and are abandoned by the engine anyway
            self._owned.discard(part)
            self._loading.pop(part, None)
            self._keys.pop(part, None)
            self._changes.pop(part, None)
        self._report()

    def _start_loading(self, part: Partition) -> asyncio.Task[dict[bytes, int]]:
        task = self._loading.get(part)
        if task is None or (task.done() and task.exception() is not None):
            task = self._loading[part] = asyncio.create_task(
                self._load(part), name=f"consumerkit-parked-keys {part[0]}/{part[1]}")
        return task

    async def _load(self, part: Partition) -> dict[bytes, int]:
        outages = 0
        while self._loading.get(part) is asyncio.current_task():
            try:
                async with self.pool.acquire() as conn:
                    loaded = (await store.parked_keys(conn, self.schema, self.consumer,
                                                      [part]))[part]
                break
            except Exception as exc:
                if not judge(exc)[1]:
                    raise
                outages += 1  # the database is away: the partition waits for it
                delay = _OUTAGE_RETRY.delay(min(outages, 8))
                log.warning("loading the parked keys of %s/%d failed (%s), retrying in %.2fs",
                            *part, describe(exc), delay)
                await asyncio.sleep(delay)
        else:
            return {}  # revoked meanwhile
        # asked by a record of a revoked partition, or revoked and assigned again while the
        # query ran (a newer load holds what another owner parked meanwhile): answer only
        if part not in self._owned or self._loading.get(part) is not asyncio.current_task():
            return loaded
        self._keys[part] = loaded
        self._changes[part] = 0
        if loaded:
            log.info("%d keys of %s/%d are parked", len(loaded), *part)
        self._report()
        return loaded

    # -- per record ---------------------------------------------------------------------------

    def holds_now(self, record: RecordLike) -> bool | None:
        """:meth:`holds` without waiting: ``None`` while the partition's parked keys are not
        loaded yet."""
        keys = self._keys.get((record.topic, record.partition))
        if keys is None:
            return None
        return record.key is not None and record.key in keys

    async def holds(self, record: RecordLike) -> bool:
        """Whether ``record``'s key is parked on its partition (in memory once loaded)."""
        part = (record.topic, record.partition)
        keys = self._keys.get(part)
        if keys is None:
            keys = await asyncio.shield(self._start_loading(part))
        return record.key is not None and record.key in keys

    async def park(self, records: Sequence[tuple[RecordLike, Decoded | None]], *, reason: str,
                   detail: str, attempts: int, start: bool,
                   abandon: asyncio.Event | None = None) -> bool | None:
        """Park ``records`` (consecutive records of one key of one partition). ``start``:
        the first one's retries ran out and parks its key; otherwise they join the key's park.
        ``False``: the key is no longer parked (nothing stored; apply them normally);
        ``None``: abandoned while the database was away."""
        record = records[0][0]
        assert record.key is not None, "a record without a key cannot be parked"
        if abandon is not None and abandon.is_set():
            return None  # revoked: its new owner decides, with the parked keys it loaded
        culprit = (reason, detail, attempts)
        entries = [_entry(self.consumer, r, d, *(culprit if i == 0 and start else FOLLOWER))
                   for i, (r, d) in enumerate(records)]
        outages = 0
        while True:
            try:
                async with self.pool.acquire() as conn:
                    stored = await store.park(conn, self.schema, entries, start=start)
                break
            except Exception as exc:
                if not judge(exc)[1]:
                    raise  # not an outage: a missing grant, say, which waiting cannot fix
                outages += 1
                delay = _OUTAGE_RETRY.delay(min(outages, 8))
                log.warning("parking a record of %s/%d failed (%s), retrying in %.2fs",
                            record.topic, record.partition, describe(exc), delay)
                if await wait_or_abandon(abandon or asyncio.Event(), delay):
                    return None
        part = (record.topic, record.partition)
        keys = self._keys.setdefault(part, {}) if part in self._owned else {}
        self._changes[part] = self._changes.get(part, 0) + 1
        if not stored:
            keys.pop(record.key, None)
            self._report()
            return False
        keys[record.key] = keys.get(record.key, 0) + len(records)
        for (r, d), entry in zip(records, entries, strict=True):
            self.observe.parked(r, d.envelope if d else None, d.route.name if d else "",
                                entry.reason, entry.detail, entry.attempts)
        self._report()
        return True

    # -- gauges and refresh -------------------------------------------------------------------

    def _report(self) -> None:
        loaded = list(self._keys.values())
        self.observe.parking(sum(len(k) for k in loaded),
                             sum(sum(k.values()) for k in loaded))

    async def refresh(self) -> None:
        """Reload the parked keys of the loaded partitions: forget keys a replay or a discard
        removed, and count records again. A partition where this consumer parked or unparked
        meanwhile keeps what it knows (its own parks are newer than the query)."""
        parts = list(self._keys)
        if not parts:
            return
        before = {p: self._changes.get(p, 0) for p in parts}
        async with self.pool.acquire() as conn:
            found = await store.parked_keys(conn, self.schema, self.consumer, parts)
        for part, keys in found.items():
            if part in self._keys and self._changes.get(part, 0) == before[part]:
                self._keys[part] = keys
        self._report()

    async def run(self, interval: float) -> None:
        """Refresh every ``interval`` seconds, until cancelled."""
        while True:
            await asyncio.sleep(interval)
            try:
                await self.refresh()
            except Exception as exc:  # the next round tries again; the gauges wait
                log.warning("refreshing the parked keys failed: %s", describe(exc))


async def open_parking(stack: contextlib.AsyncExitStack, pool: asyncpg.Pool, schema: str,
                       consumer: str, observer: Observer, wanted: bool, interval: float,
                       ) -> ParkingLot | None:
    """The consumer's parking lot if ``wanted`` (its tables checked), refreshed every
    ``interval`` seconds until ``stack`` unwinds; ``None`` otherwise."""
    if not wanted:
        return None
    lot = ParkingLot(pool, schema, consumer, observer)
    await lot.check()
    refresh = asyncio.create_task(lot.run(interval), name="consumerkit-parked-keys")
    stack.push_async_callback(_cancel, refresh)
    return lot


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def parks(routes: RouteTable, retry: RetryPolicy) -> bool:
    """Whether any handler of ``routes`` parks (its own choice, else the policy's)."""
    return any((route.on_exhausted or retry.on_exhausted) == "park"
               for route in (*routes.by_type.values(), *routes.by_topic.values()))


def _entry(consumer: str, record: RecordLike, decoded: Decoded | None, reason: str,
           detail: str, attempts: int) -> ParkedRecord:
    env = decoded.envelope if decoded is not None else None
    assert record.key is not None
    return ParkedRecord(
        consumer=consumer, topic=record.topic, partition=record.partition,
        offset=record.offset, key=record.key, value=record.value,
        headers=list(record.headers or ()), timestamp_ms=record.timestamp, reason=reason,
        detail=detail, attempts=attempts, event_id=env.event_id if env else None,
        event_type=env.event_type if env else None)
