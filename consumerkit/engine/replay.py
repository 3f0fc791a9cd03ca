"""Replay and discard a parked key: the commands' side of parking.

A replay applies the key's parked records in offset order, each in a transaction of its own
through the consumer's own path (dedup claim, handler, outbox), and that transaction also
marks the record replayed: a replay cut short and run again starts after the last record it
applied, and the dedup row absorbs anything applied twice. When no record is left, the key is
unparked under its row lock; records the consumer parked meanwhile are replayed first. Two
replays of one key never run at once, nor a replay and a discard (an advisory lock, held by a
transaction: behind a transaction pooler a session lock would stay on a shared backend).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import asyncpg

from ..deadletter.writer import DeadLetterWriter
from ..dedup.stores import store_for
from ..errors import DeadLetter, DecodeError, ParkingError, is_retriable
from ..parking import store
from ..parking.entry import ParkedKey, ParkedRecord
from ..shared.failures import describe, judge
from ..stats import ConsumerStats
from ..types import ClaimStatus, DbConnection, SinkResources
from .decode import Decoded
from .lifecycle import open_pool
from .observing import consumer_observer
from .pipeline import Outcome, Pipeline

if TYPE_CHECKING:
    from ..consumer import Consumer


class _Discarded(Exception):
    """The parked record was gone when its replay marked it applied: the key was discarded
    meanwhile (by hand, or by an older consumerkit's discard), so its effects roll back."""

    retriable = False


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What a replay did: the key, and its records by outcome (``not_parked``: the key was
    not parked when the replay began; ``previously`` says who unparked it last, if known)."""

    key: ParkedKey | None
    applied: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    skipped: int = 0
    not_parked: bool = False
    previously: tuple[str, str, str] | None = None

    @property
    def records(self) -> int:
        return self.applied + self.duplicates + self.dead_lettered + self.skipped


async def find_key(conn: DbConnection, schema: str, consumer: str, key: bytes,
                   topic: str | None, partition: int | None) -> ParkedKey | None:
    """The parked key meant, ``None`` if it is not parked; ambiguous: a :class:`ParkingError`
    naming the partitions to choose from."""
    found = await store.list_keys(conn, schema, consumer, key, topic, partition)
    if len(found) > 1:
        where = ", ".join(f"{k.topic}/{k.partition}" for k in found)
        raise ParkingError(f"key {key.decode(errors='backslashreplace')!r} is parked on "
                           f"{where}: choose one with --topic and --partition")
    return found[0] if found else None


async def not_found(conn: DbConnection, schema: str, consumer: str, key: bytes,
                    ) -> tuple[str, str, str]:
    """The last replay or discard of a key that is not parked; a :class:`ParkingError` if
    it never was."""
    last = await store.last_audit(conn, schema, consumer, key)
    if last is None and not await store.known_consumer(conn, schema, consumer):
        raise ParkingError(f"consumer {consumer!r} never parked a key (check the name; "
                           "consumerkit parked list shows every consumer's)")
    if last is None:
        raise ParkingError(f"no parked key {key.decode(errors='backslashreplace')!r} for "
                           f"consumer {consumer} (consumerkit parked list shows them)")
    return last


async def discard_key(conn: DbConnection, schema: str, consumer: str, key: bytes,
                      topic: str | None = None, partition: int | None = None,
                      ) -> tuple[ParkedKey, int]:
    """Drop a parked key and its records, leaving an audit row; the key and the number of
    records dropped."""
    parked = await find_key(conn, schema, consumer, key, topic, partition)
    if parked is None:
        action, actor, when = await not_found(conn, schema, consumer, key)
        raise ParkingError(f"key {key.decode(errors='backslashreplace')!r} is not parked "
                           f"(last {action} by {actor} at {when})")
    # not while it is replayed: the replay would go on applying what the audit calls dropped
    async with _exclusive(conn, schema, parked, "a replay of key {key} is running: discard it "
                                                 "once the replay has ended"):
        dropped = await store.discard(conn, schema, parked)
    return parked, dropped or 0


async def replay_key(consumer: Consumer, key: bytes, topic: str | None = None,
                     partition: int | None = None) -> ReplayReport:
    """Apply the parked records of ``key`` through ``consumer``'s handlers, in order, once;
    then unpark the key. A handler that still fails stops the replay with a
    :class:`ParkingError` (what was applied stays applied; the rest stays parked)."""
    dsn = consumer.postgres_dsn
    if dsn is None:
        raise ParkingError("no PostgreSQL DSN: pass --postgres or set CONSUMERKIT_POSTGRES_DSN")
    schema, name = consumer.schema, consumer.name
    # the replay's reads, the lock's transaction, a record's transaction, a dead letter
    pool = await open_pool(dsn, f"{name} replay", 4, pooler=consumer.postgres_pooler)
    try:
        async with pool.acquire() as conn, pool.acquire() as lock:
            parked = await find_key(conn, schema, name, key, topic, partition)
            if parked is None:
                return ReplayReport(None, not_parked=True,
                                    previously=await not_found(conn, schema, name, key))
            async with (_exclusive(lock, schema, parked, "another replay of key {key} is running"),
                        _pipeline(consumer, pool) as pipeline):
                return await _replay(pipeline, conn, schema, parked)
    finally:
        await pool.close()


async def _replay(pipeline: Pipeline, conn: DbConnection, schema: str,
                  parked: ParkedKey) -> ReplayReport:
    mark = store.mark_replayed_sql(schema)
    counts = dict.fromkeys(Outcome, 0)
    while True:
        records = await store.waiting(conn, schema, parked)
        if not records:
            if await store.finish(conn, schema, parked) is not None:
                break
            continue  # the consumer parked more records of the key meanwhile
        for record in records:
            counts[await _replay_one(pipeline, conn, record, mark)] += 1
    return ReplayReport(parked, applied=counts[Outcome.APPLIED],
                        duplicates=counts[Outcome.DUPLICATE],
                        dead_lettered=counts[Outcome.DEAD_LETTERED],
                        skipped=counts[Outcome.EXPIRED_SKIPPED]
                        + counts[Outcome.UNHANDLED_SKIPPED])


async def _replay_one(pipeline: Pipeline, conn: DbConnection, parked: ParkedRecord,
                      mark: str) -> Outcome:
    record = parked.record()
    never = asyncio.Event()  # a replay is never abandoned: it stops on an error instead
    try:
        decoded = pipeline.decoder.decode(record)
    except DecodeError as exc:  # as the consumer would have done, had the key not been parked
        outcome = await pipeline.unapplied.undecodable(record, exc, never)
        await conn.execute(mark, parked.id)
        return outcome
    marked = _marking(decoded, mark, parked.id)
    attempt = 0
    while True:
        attempt += 1
        try:
            async with pipeline.pool.acquire() as own:  # the one transaction path
                [claim] = await pipeline.applier.apply(own, [marked], attempt)
            break
        except Exception as raised:
            error, outage = judge(raised)
            if isinstance(error, _Discarded):
                raise ParkingError(
                    f"replay stopped at {record.topic}/{record.partition}/{record.offset} "
                    f"(event {decoded.envelope.event_id}): its key was discarded meanwhile; "
                    "neither it nor any later record of the key was applied") from None
            if outage:
                attempt -= 1
            elif isinstance(error, DeadLetter):  # the handler's own decision, as when consumed
                outcome = await pipeline.unapplied.dead_letter(
                    record, "dead_lettered_by_handler", describe(error), attempt, decoded, never)
                await conn.execute(mark, parked.id)
                return outcome
            elif not is_retriable(error) or attempt >= pipeline.retry.max_attempts:
                raise ParkingError(
                    f"replay stopped at {record.topic}/{record.partition}/{record.offset} "
                    f"(event {decoded.envelope.event_id}) after {attempt} attempts: "
                    f"{describe(error)}; the records before it are applied, it and the rest "
                    "stay parked") from None
            await asyncio.sleep(pipeline.retry.delay(max(attempt, 1)))
    outcome = await pipeline.settle(claim, record, decoded, attempt, never)
    if claim.status is not ClaimStatus.CLAIMED:  # applied before, or too old to know
        await conn.execute(mark, parked.id)
    return outcome


def _marking(decoded: Decoded, mark: str, parked_id: int | None) -> Decoded:
    """``decoded`` with a handler that also marks the parked record replayed, in the
    handler's own transaction: applied and marked commit together, or neither."""
    func = decoded.route.func

    async def apply_and_mark(event: Any, ctx: Any) -> None:
        await func(event, ctx)
        if await ctx.tx.execute(mark, parked_id) == "UPDATE 0":
            raise _Discarded

    route = dataclasses.replace(decoded.route, func=apply_and_mark)
    return dataclasses.replace(decoded, route=route)


@contextlib.asynccontextmanager
async def _exclusive(conn: DbConnection, schema: str, parked: ParkedKey, busy: str,
                     ) -> AsyncIterator[None]:
    """One replay or discard of a key at a time: an advisory lock on the key, held by a
    transaction of ``conn`` until the block ends (``busy``: the error when it is taken,
    ``{key}`` standing for the key). Statements on ``conn`` inside the block run in that
    transaction; it commits when the block ends without an error."""
    digest = hashlib.blake2b(repr((schema, parked.consumer, parked.topic, parked.partition,
                                   parked.key)).encode(), digest_size=8).digest()
    lock = int.from_bytes(digest, "big", signed=True)
    async with conn.transaction():
        if not await conn.fetchval("SELECT pg_try_advisory_xact_lock($1)", lock):
            raise ParkingError(busy.format(key=repr(parked.key_text)))
        yield


@contextlib.asynccontextmanager
async def _pipeline(consumer: Consumer, pool: asyncpg.Pool) -> AsyncIterator[Pipeline]:
    """The consumer's transaction path, with its handlers, dedup, outbox and dead letters."""
    stats = ConsumerStats()
    observer, _ = consumer_observer(consumer.name, stats, consumer.observers, None)
    resources = SinkResources(pool, consumer.schema, consumer.kafka_bootstrap or "",
                              consumer.kafka_options, tuple(consumer.topics))
    async with contextlib.AsyncExitStack() as stack:
        for sink in consumer.dead_letter:
            await sink.open(resources)
            stack.push_async_callback(sink.close)
        yield Pipeline(
            consumer=consumer.name, namespace=consumer.name, pool=pool,
            dedup=store_for(consumer.schema, consumer.dedup),
            decoder=consumer.decoder(),
            retry=consumer.retry, dead_letters=DeadLetterWriter(consumer.dead_letter),
            expired=consumer.dedup.expired, stats=stats, concurrency=1,
            handler_timeout=consumer.handler_timeout, outbox=consumer.outbox,
            observer=observer)
