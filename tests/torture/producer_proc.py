"""The producers, in their own OS process: writers that each commit a business row and its
outbox event in one transaction, with a gap-free sequence per aggregate (the ``counters`` row
of the aggregate, locked by the UPDATE, hands out the numbers). Some transactions roll back:
their events must never have an effect. Database errors (a restart, a killed connection) are
waited out; whatever commits is in ``business``, which is the checker's truth.

``python -m tests.torture.producer_proc --dsn ... --schema ... --events N --rate R --seed S``
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import time
import uuid

import asyncpg

from consumerkit.outbox import NewEvent, Outbox
from consumerkit.shared.identifiers import identifier
from consumerkit.shared.pooler import POOLERS, Pooler, connect
from tests.harness.pgbouncer import check_pooler

from .ledger import EVENT_TYPE

WRITERS = 6
ROLLBACK_SHARE = 0.04

log = logging.getLogger("torture.producer")


class _RollBack(Exception):
    pass


class Producer:
    def __init__(self, dsn: str, schema: str, events: int, aggregates: int, rate: float,
                 seed: int, pooler: Pooler = "none") -> None:
        self.dsn = dsn
        self.pooler = pooler
        self.events = events
        self.aggregates = aggregates
        self.pace = WRITERS / rate  # seconds between one writer's transactions, per event
        self.rng = random.Random(seed)
        self.outbox = Outbox(schema)
        s = identifier(schema)
        self.next_seq = f"UPDATE {s}.counters SET n = n + $2 WHERE aggregate = $1 RETURNING n"
        self.business = (f"INSERT INTO {s}.business (event_id, aggregate, seq) "
                         "SELECT * FROM unnest($1::text[], $2::text[], $3::int[])")
        self.committed = 0

    async def writer(self) -> None:
        conn: asyncpg.Connection[asyncpg.Record] | None = None
        while self.committed < self.events:
            started = time.monotonic()
            count = min(self.rng.randint(1, 3), self.events - self.committed)
            aggregate = f"agg-{self.rng.randrange(self.aggregates)}"
            roll_back = self.rng.random() < ROLLBACK_SHARE
            try:
                if conn is None or conn.is_closed():
                    conn = await connect(self.dsn, pooler=self.pooler, timeout=10,
                                         application_name="torture-producer")
                await self._write(conn, aggregate, count, roll_back)
                if not roll_back:
                    self.committed += count
            except _RollBack:
                pass
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                log.warning("producer: %r, retrying", exc)
                if conn is not None:
                    conn.terminate()
                conn = None
                await asyncio.sleep(0.2)  # the database is away: a restart takes ~0.5 s
                continue
            await asyncio.sleep(max(0.0, self.pace * count - (time.monotonic() - started)))
        if conn is not None:
            await conn.close()

    async def _write(self, conn: asyncpg.Connection[asyncpg.Record], aggregate: str,
                     count: int, roll_back: bool) -> None:
        async with conn.transaction():
            last = await conn.fetchval(self.next_seq, aggregate, count)
            seqs = list(range(last - count + 1, last + 1))
            ids = [str(uuid.uuid4()) for _ in seqs]
            await conn.execute(self.business, ids, [aggregate] * count, seqs)
            await self.outbox.add_many(conn, [
                NewEvent(EVENT_TYPE, "ledger", aggregate, {"aggregate": aggregate, "seq": s},
                         event_id=uuid.UUID(i)) for i, s in zip(ids, seqs, strict=True)])
            if roll_back:
                raise _RollBack

    async def run(self) -> None:
        await asyncio.gather(*(self.writer() for _ in range(WRITERS)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--aggregates", type=int, required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--pooler", choices=POOLERS, default="none")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(Producer(args.dsn, args.schema, args.events, args.aggregates, args.rate,
                         args.seed, check_pooler(args.pooler)).run())


if __name__ == "__main__":
    main()
