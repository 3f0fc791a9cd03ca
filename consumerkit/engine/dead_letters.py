"""Replay and discard dead letters: the commands' and the API's side of the dead-letter table.

A replay decodes each chosen entry with the consumer's own decoder (upcasters included) and
applies it through the consumer's own transaction path (:class:`~consumerkit.engine.apply.
Applier`: the dedup claim, the handler, the outbox); the same transaction marks the entry
``replayed``, so the effects and the mark commit together or not at all. Entries go in their
original order, one lane per key (topic, partition, key), a few keys at a time. A replay cut
short (killed) and run again takes only the entries still waiting, and the dedup claim
absorbs an event applied by other means meanwhile. An entry that fails again stays waiting,
with the new error beside it, and the later entries of its key wait too (applying them would
break the key's order).

One replay or discard of a consumer's partition at a time: a transaction-scoped advisory lock
per (consumer, topic, partition), held on a connection of its own for the whole run. Behind a
transaction pooler (PgBouncer, transaction mode) that connection's transaction keeps its
server connection, and a killed run's locks go with its connection; a session lock would stay
behind on a shared server connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import asyncpg

from ..deadletter import store
from ..deadletter.store import DeadLetterFilter, StoredDeadLetter
from ..deadletter.table import pg_text
from ..display import displayable
from ..errors import DeadLetterError, DecodeError
from ..observability.metrics import ConsumerMetrics
from ..observability.observer import Observer, fanout
from ..stats import StatsObserver
from ..types import DbConnection
from .dead_letter_apply import Replayer
from .decode import Decoded
from .lifecycle import open_pool

if TYPE_CHECKING:
    from ..consumer import Consumer


LANES = 4
"""Keys replayed at once: enough to hide a transaction's round trips, few enough to leave
the database to the consumers."""


@dataclass(frozen=True, slots=True)
class DeadLetterReplayReport:
    """What a replay did with the entries it chose: ``replayed`` (applied now),
    ``duplicates`` (applied before: marked replayed without running the handler), ``failed``
    (failed again: left waiting, the error beside them), ``held_back`` (behind a failed entry
    of their key, or behind an earlier waiting one that was not chosen), ``gone`` (replayed
    or discarded by someone else meanwhile); ``failures``: a line for each entry that failed
    again and each key held back behind an entry not chosen."""

    chosen: int
    replayed: int = 0
    duplicates: int = 0
    failed: int = 0
    held_back: int = 0
    gone: int = 0
    failures: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Preview:
    """A dry run's view of one entry: decoded (``decoded``) or why not (``error``)."""

    entry: StoredDeadLetter
    decoded: Decoded | None
    error: str | None


async def replay_dead_letters(consumer: Consumer, chosen: DeadLetterFilter | None = None, *,
                              note: str | None = None) -> DeadLetterReplayReport:
    """Apply the waiting dead letters ``chosen`` names (of ``consumer``; default all) through
    ``consumer``'s handlers, in per-key order, exactly once however often this runs; each one
    marked replayed by the database role with ``note``. Raises :class:`DeadLetterError` when
    a replay or a discard of the same partitions is running."""
    chosen = _own(consumer, chosen)
    async with (_session(consumer, 2 + LANES) as (pool, schema), pool.acquire() as conn,
                pool.acquire() as lock):
        locked = _partitions(await store.select(conn, schema, chosen))
        async with exclusive(lock, schema, locked):
            entries = [e for e in await store.select(conn, schema, chosen)  # as of the lock
                       if (e.entry.consumer, e.entry.topic, e.entry.partition) in locked]
            replayer = Replayer(consumer, pool, _observer(consumer))
            return await _replay(replayer, pool, schema, entries,
                                 None if note is None else pg_text(note))


async def preview_dead_letters(consumer: Consumer, chosen: DeadLetterFilter | None = None,
                               ) -> list[Preview]:
    """Decode the waiting dead letters ``chosen`` names as a replay would; writes nothing."""
    chosen = _own(consumer, chosen)
    decoder = consumer.decoder()
    async with _session(consumer, 1) as (pool, schema), pool.acquire() as conn:
        entries = await store.select(conn, schema, chosen)
    previews = []
    for entry in entries:
        try:
            previews.append(Preview(entry, decoder.decode(entry.record()), None))
        except DecodeError as exc:
            previews.append(Preview(entry, None, f"{exc.reason}: {exc.detail}"))
    return previews


async def discard_dead_letters(conn: DbConnection, schema: str, chosen: DeadLetterFilter, *,
                               note: str | None = None, observer: Observer | None = None,
                               ) -> list[int]:
    """Mark the waiting dead letters ``chosen`` names discarded (by the database role, with
    ``note``); their ids. Refused while a replay of their partitions runs."""
    entries = await store.select(conn, schema, chosen)
    if not entries:
        return []
    async with exclusive(conn, schema, _partitions(entries)):
        marked = await store.discard(conn, schema, [e.id for e in entries], note)
    counts: dict[str, int] = {}
    for topic, _ in marked:
        counts[topic] = counts.get(topic, 0) + 1
    if observer is not None:
        for topic, count in sorted(counts.items()):
            observer.dead_letters_resolved(topic, "discarded", count)
    return sorted(entry_id for _, entry_id in marked)


def _own(consumer: Consumer, chosen: DeadLetterFilter | None) -> DeadLetterFilter:
    chosen = chosen or DeadLetterFilter()
    if chosen.consumer is not None and chosen.consumer != consumer.name:
        raise DeadLetterError(
            f"the dead letters of consumer {chosen.consumer!r} are replayed through that "
            f"consumer; the app given is consumer {consumer.name!r}")
    return dataclasses.replace(chosen, consumer=consumer.name)


def _observer(consumer: Consumer) -> Observer:
    observers: list[Observer] = [StatsObserver(consumer.stats), *consumer.observers]
    if consumer.registry is not None:
        observers.append(ConsumerMetrics(consumer.registry, consumer.name))
    return fanout(observers)


@contextlib.asynccontextmanager
async def _session(consumer: Consumer, size: int,
                   ) -> AsyncIterator[tuple[asyncpg.Pool, str]]:
    if consumer.postgres_dsn is None:
        raise DeadLetterError("no PostgreSQL DSN: pass --postgres or set "
                              "CONSUMERKIT_POSTGRES_DSN")
    pool = await open_pool(consumer.postgres_dsn, f"{consumer.name} dead-letter replay", size,
                           pooler=consumer.postgres_pooler)
    try:
        yield pool, consumer.schema
    finally:
        await pool.close()


def _partitions(entries: Iterable[StoredDeadLetter]) -> list[tuple[str, str, int]]:
    return sorted({(e.entry.consumer, e.entry.topic, e.entry.partition) for e in entries})


@contextlib.asynccontextmanager
async def exclusive(conn: DbConnection, schema: str, partitions: list[tuple[str, str, int]],
                    ) -> AsyncIterator[None]:
    """Hold the dead-letter lock of each of ``partitions`` (consumer, topic, partition) in a
    transaction of ``conn`` until the block ends; a :class:`DeadLetterError` if another
    replay or discard holds one. Statements on ``conn`` in the block run in that
    transaction, committed when it ends without an error."""
    async with conn.transaction():
        for name, topic, partition in partitions:
            digest = hashlib.blake2b(repr((schema, "dead_letters", name, topic, partition))
                                     .encode(), digest_size=8).digest()
            lock = int.from_bytes(digest, "big", signed=True)
            if not await conn.fetchval("SELECT pg_try_advisory_xact_lock($1)", lock):
                raise DeadLetterError(
                    f"a replay or discard of the dead letters of {displayable(name)} on "
                    f"{displayable(topic)}/{partition} is running: try again once it has ended")
        yield


async def _replay(replayer: Replayer, pool: asyncpg.Pool, schema: str,
                  entries: list[StoredDeadLetter], note: str | None) -> DeadLetterReplayReport:
    lanes: dict[tuple[str, int, bytes | None], list[StoredDeadLetter]] = {}
    for entry in entries:  # in (topic, partition, offset) order: each lane in its key's order
        lanes.setdefault((entry.entry.topic, entry.entry.partition, entry.entry.key),
                         []).append(entry)
    counts = {"replayed": 0, "duplicates": 0, "failed": 0, "held_back": 0, "gone": 0}
    by_topic: dict[tuple[str, str], int] = {}  # (topic, outcome): told once, at the end
    failures: list[str] = []
    if entries:  # a key with an earlier entry waiting that was not chosen waits for it
        async with pool.acquire() as conn:
            first = await store.first_waiting(conn, schema, entries[0].entry.consumer,
                                              sorted({e.entry.topic for e in entries}))
        for where, lane in list(lanes.items()):
            if first.get(where, lane[0].entry.offset) < lane[0].entry.offset:
                del lanes[where]
                counts["held_back"] += len(lane)
                failures.append(f"{_failure(lane[0], '')}held back: an earlier entry of its "
                                "key waits and was not chosen (replay it first, or discard it)")
    queue = list(lanes.values())
    queue.reverse()

    async def run() -> None:
        while queue:
            lane = queue.pop()
            for index, entry in enumerate(lane):
                outcome, error = await replayer.replay(entry, schema, note)
                counts[outcome] += 1
                told = {"replayed": "replayed", "duplicates": "replayed",
                        "failed": "replay_failed"}.get(outcome)
                if told is not None:
                    where = (entry.entry.topic, told)
                    by_topic[where] = by_topic.get(where, 0) + 1
                if error is not None:
                    failures.append(_failure(entry, error))
                    async with pool.acquire() as conn:
                        await store.replay_failed(conn, schema, entry.id, error)
                    counts["held_back"] += len(lane) - index - 1
                    break

    try:
        async with asyncio.TaskGroup() as lanes_running:  # one fails: the others stop too
            for _ in range(min(LANES, len(queue))):
                lanes_running.create_task(run())
    except BaseExceptionGroup as group:  # raised as it was, for one line in the CLI
        raise group.exceptions[0] from None
    finally:
        for (topic, outcome), count in sorted(by_topic.items()):
            replayer.observe.dead_letters_resolved(topic, outcome, count)
    return DeadLetterReplayReport(len(entries), counts["replayed"], counts["duplicates"],
                        counts["failed"], counts["held_back"], counts["gone"],
                        tuple(failures))


def _failure(entry: StoredDeadLetter, error: str) -> str:
    e = entry.entry
    return (f"#{entry.id} {displayable(e.topic)}/{e.partition}/{e.offset} "
            f"(event {displayable(e.event_id, 200)}): {displayable(error, 500)}")

