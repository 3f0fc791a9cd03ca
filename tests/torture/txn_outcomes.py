"""The outcomes the transactional writers never recorded, decided before the drain.

A writer killed behind the producer (``run._stop_behind``), or one whose commit failed, leaves
records ``open`` or ``unknown`` in ``txn_events``: the transaction may have committed (the kill
fell between the commit and the mark) or not. Decided only by the final read, a committed one
would be owed an effect the drain never waited for: the consumers stopped before applying it,
and it counted as lost. So, once the writers are stopped, every transaction on the topic is
waited out (a killed writer's open one is aborted by the coordinator after its timeout), the
topic is read ``read_committed`` to its last stable offset, and each undecided record is marked
``<outcome>_committed`` (and added to ``business``, so the drain waits for its effect) or
``<outcome>_aborted``."""

from __future__ import annotations

import asyncio
import logging
import time

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from consumerkit.shared.identifiers import identifier
from consumerkit.types import DbConnection

log = logging.getLogger("torture")

QUIET_POLLS = 8  # empty polls in a row (4 s) that end the read short of the stable offset

async def undecided(conn: DbConnection, schema: str) -> set[str]:
    s = identifier(schema)
    return {r[0] for r in await conn.fetch(
        f"SELECT event_id FROM {s}.txn_events WHERE outcome IN ('open', 'unknown')")}


async def record(conn: DbConnection, schema: str, committed: set[str], aborted: set[str]) -> None:
    s = identifier(schema)
    async with conn.transaction():
        for ids, decided in ((committed, "committed"), (aborted, "aborted")):
            await conn.execute(f"UPDATE {s}.txn_events SET outcome = outcome || '_' || $2 "
                               "WHERE event_id = ANY($1) AND outcome IN ('open', 'unknown')",
                               sorted(ids), decided)
        await conn.execute(f"INSERT INTO {s}.business (event_id, aggregate, seq) "
                           f"SELECT event_id, aggregate, seq FROM {s}.txn_events "
                           "WHERE event_id = ANY($1) ON CONFLICT DO NOTHING", sorted(committed))


async def _ends(reader: AIOKafkaConsumer, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
    ends: dict[TopicPartition, int] = await reader.end_offsets(tps)
    return ends


class Undecidable(Exception):
    """The topic could not be read to its stable offset in time: nothing is decided."""


async def committed_ids(bootstrap: str, topic: str, partitions: int, wanted: set[str],
                        timeout: float = 120.0) -> set[str]:
    """Those of ``wanted`` a ``read_committed`` reader finds on ``topic`` once no transaction
    is open on it (its last stable offset caught up with its high watermark), read to that
    stable offset; :class:`Undecidable` if either takes longer than ``timeout``."""
    stable = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                              enable_auto_commit=False, isolation_level="read_committed")
    latest = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                              enable_auto_commit=False)
    await stable.start()
    await latest.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        stable.assign(tps)
        deadline = time.monotonic() + timeout
        while True:  # bounded: the coordinator aborts an abandoned transaction at its timeout
            # the watermark first: a stable offset read after it and at least as high means
            # every transaction begun before that read has ended (relays keep appending)
            hw = await _ends(latest, tps)
            lso = await _ends(stable, tps)
            if all(lso[tp] >= hw[tp] for tp in tps):
                break
            if time.monotonic() > deadline:
                raise Undecidable(f"a transaction stayed open on {topic} for {timeout:.0f}s")
            await asyncio.sleep(0.5)
        await stable.seek_to_beginning(*tps)
        found: set[str] = set()
        quiet = 0
        deadline = time.monotonic() + timeout
        while found != wanted:
            if time.monotonic() > deadline:
                raise Undecidable(f"{topic} not read to its stable offset in {timeout:.0f}s")
            batch = await stable.getmany(timeout_ms=500, max_records=5000)
            for records in batch.values():
                for r in records:
                    event_id = dict(r.headers).get("id", b"").decode()
                    if event_id in wanted:
                        found.add(event_id)
            quiet = 0 if batch else quiet + 1
            positions = [await stable.position(tp) for tp in tps]
            # a marker can end a partition: its position then stops one short of the offset;
            # batches aiokafka drops (aborted ones) can leave it further back: a quiet read
            if not batch and (quiet >= QUIET_POLLS or all(
                    at >= hw[tp] - 1 for at, tp in zip(positions, tps, strict=True))):
                break
        return found
    finally:
        await stable.stop()
        await latest.stop()


async def settle(conn: DbConnection, bootstrap: str, schema: str, topic: str,
                 partitions: int) -> dict[str, int]:
    """Decide every undecided record; returns how many went each way (nothing, and the
    final read decides, if the topic cannot be read to its stable offset)."""
    wanted = await undecided(conn, schema)
    if not wanted:
        return {}
    try:
        committed = await committed_ids(bootstrap, topic, partitions, wanted)
    except (Undecidable, KafkaError, OSError) as exc:
        log.warning("undecided transactional records left to the final read: %r", exc)
        return {}
    await record(conn, schema, committed, wanted - committed)
    log.info("undecided transactional records: %d committed, %d aborted",
             len(committed), len(wanted) - len(committed))
    return {"committed": len(committed), "aborted": len(wanted) - len(committed)}
