"""Negative controls for the outbox torture checker: the same workload and the same ``check``,
published by a correct relay (which must pass) and by two deliberately broken ones that
reliability.md lists, which the checker must catch as lost events:

- ``cursor``: reads ``seq > last seq read``, so a transaction that commits after later seqs
  were published is skipped for good;
- ``delete-first``: deletes the rows it claims before sending them, so a send that fails
  loses its event.

The broken relays are stores defined here and swapped into a real :class:`Relay`; nothing of
them is in the library. A deterministic late commit (a transaction held open until the relay
has published rows written after it) and a sink that fails the first attempt of every 13th
event make both faults certain, not likely.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence

import asyncpg
import orjson
import pytest

from consumerkit import Postgres
from consumerkit.outbox import KafkaSink, NewEvent, Outbox, OutboxEvent, OutboxTable, Relay
from consumerkit.outbox.store import RelayStore
from consumerkit.retry import RetryPolicy
from consumerkit.shared.identifiers import identifier
from consumerkit.testing.services import MakeTopic
from consumerkit.types import DbConnection

from ..brokers import PRODUCER_OPTIONS
from ..pooling import POOLER
from .conftest import read_all, wait_until
from .test_torture import AGGREGATES, Workload, check

EVENTS = 1500
WRITERS = 4


class CorrectStore(RelayStore):
    """The library's store, plus: has it published everything it ever will?"""

    async def finished(self, pool: asyncpg.Pool[asyncpg.Record]) -> bool:
        left: int = await pool.fetchval(f"SELECT count(*) FROM {self.table.events}")
        return left == 0


class CursorStore(CorrectStore):
    """Broken: claims only rows above the highest seq it has read (``id > cursor``)."""

    def __init__(self, table: OutboxTable) -> None:
        super().__init__(table)
        where = "WHERE o.slot = ANY($1::smallint[])"
        assert where in self._claim
        self._claim = self._claim.replace(where, f"{where} AND o.seq > $3")
        self.cursor = 0

    async def claim(self, conn: DbConnection, slots: Collection[int],
                    limit: int) -> list[OutboxEvent]:
        rows = await conn.fetch(self._claim, sorted(slots), limit, self.cursor)
        events = [OutboxEvent(r[0], r[1], r[2], r[3], r[4], r[5].encode(), r[6],
                              orjson.loads(r[7]), r[8]) for r in rows]
        if events:
            self.cursor = max(self.cursor, events[-1].seq)
        return events

    async def finished(self, pool: asyncpg.Pool[asyncpg.Record]) -> bool:
        above: int = await pool.fetchval(
            f"SELECT count(*) FROM {self.table.events} WHERE seq > $1", self.cursor)
        return above == 0


class DeleteFirstStore(CorrectStore):
    """Broken: deletes the rows it claims before they are sent."""

    async def claim(self, conn: DbConnection, slots: Collection[int],
                    limit: int) -> list[OutboxEvent]:
        events = await super().claim(conn, slots, limit)
        await self.delete(conn, [e.seq for e in events])
        return events


class FlakySink(KafkaSink):
    """The Kafka sink, except that the first attempt of every 13th event of an aggregate
    fails (a transient error, retried after the back-off); like every sink, it then sends
    nothing later of that aggregate in the batch."""

    acked = 0

    async def send(self, events: Sequence[OutboxEvent]) -> list[BaseException | None]:
        refused: dict[int, BaseException] = {}
        blocked: set[tuple[str, str]] = set()
        for i, e in enumerate(events):
            aggregate = (e.aggregate_type, e.aggregate_id)
            if aggregate in blocked:
                refused[i] = RuntimeError("not sent: an earlier event failed")
            elif e.attempts == 0 and orjson.loads(e.payload)["seq"] % 13 == 0:
                refused[i] = RuntimeError("destination busy")
                blocked.add(aggregate)
        passing = [e for i, e in enumerate(events) if i not in refused]
        acked = iter(await super().send(passing) if passing else [])
        results = [refused[i] if i in refused else next(acked) for i in range(len(events))]
        self.acked += sum(r is None for r in results)
        return results


@pytest.mark.slow
@pytest.mark.parametrize(("store", "caught"), [
    (CorrectStore, None),
    (CursorStore, "never published"),
    (DeleteFirstStore, "never published"),
], ids=["correct", "cursor", "delete-first"])
async def test_the_checker_catches_a_broken_relay(
    postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic, outbox: Outbox,
    outbox_table: OutboxTable, store: type[CorrectStore], caught: str | None,
) -> None:
    topic = await make_topic(partitions=4)
    schema = outbox_table.schema
    pool = await asyncpg.create_pool(postgres_dsn, min_size=2, max_size=WRITERS + 3)
    assert pool is not None
    await pool.execute(f"CREATE TABLE {identifier(schema)}.counters "
                       "(aggregate text PRIMARY KEY, n int NOT NULL DEFAULT 0)")
    await pool.execute(f"INSERT INTO {identifier(schema)}.counters (aggregate) "
                       f"SELECT 'agg-' || i FROM generate_series(0, {AGGREGATES - 1}) i")
    work = Workload(outbox, schema, seed=11, events=EVENTS)
    sink = FlakySink(kafka_bootstrap, route=topic, kafka_options=dict(PRODUCER_OPTIONS))
    relay = Relay(Postgres(dsn=postgres_dsn, schema=schema, pooler=POOLER), sink,
                  handle_signals=False,
                  batch_size=100,
                  poll_interval=0.1, retry=RetryPolicy(max_attempts=10, initial_delay=0.05,
                                                       max_delay=0.2))
    relay._store = checked = store(outbox_table)
    task = asyncio.create_task(relay.run())
    try:
        late = await pool.acquire()
        held = late.transaction()
        await held.start()  # its seq is lower than every row the writers add
        [late_id] = await outbox.add_many(late, [NewEvent(
            "step.recorded", "ledger", "late", {"aggregate": "late", "seq": 1})])

        async def published_past_it() -> bool:
            return relay.published >= 200

        writers = [asyncio.create_task(work.writer(pool)) for _ in range(WRITERS)]
        await wait_until(published_past_it, 60, "rows after the held one published")
        await held.commit()
        await pool.release(late)
        work.committed[late_id] = ("late", 1)
        await asyncio.gather(*writers)
        await wait_until(lambda: checked.finished(pool), 60, "the relay finished")
    finally:
        relay.stop()
        await asyncio.wait_for(task, 30)
        await pool.close()

    records = await read_all(kafka_bootstrap, [topic], lambda found: len(found) >= sink.acked)
    if caught is None:
        deliveries, _duplicates = check(records, work)
        assert deliveries >= len(work.committed)
    else:
        with pytest.raises(AssertionError, match=caught):
            check(records, work)

