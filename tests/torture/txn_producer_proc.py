"""Transactional producers upstream, in their own OS process: writers that each send a few
records in one Kafka transaction (aiokafka's transactional producer, idempotent, acks=all)
straight to the torture topic, and abort a share of their transactions. ``read_committed``
consumers must never apply a record of an aborted transaction.

The truth for the checker is in ``txn_events`` (:mod:`tests.torture.ledger`): every record is
written there as ``open`` before it is sent, then marked ``committed`` (and its event added to
``business``, so it must have an effect), ``aborted`` (it must have none) or ``unknown`` when
the commit failed and its outcome cannot be told (the final read of the topic decides). A
writer whose commit outcome is unknown moves to new aggregates, so no sequence has a gap.

``python -m tests.torture.txn_producer_proc --dsn ... --bootstrap ... --schema ... --topic ...
--events N --rate R --seed S``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from consumerkit.shared.identifiers import identifier

from .ledger import EVENT_TYPE

WRITERS = 2
ABORT_SHARE = 0.2
AGGREGATES_PER_WRITER = 8

log = logging.getLogger("torture.txn_producer")
_T = TypeVar("_T")


class TxnProducer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed * 7919 + 1)
        self.pace = WRITERS / args.rate
        s = identifier(args.schema)
        self.open_sql = (f"INSERT INTO {s}.txn_events (event_id, aggregate, seq, outcome) "
                         "SELECT e, a, q, 'open' FROM unnest($1::text[], $2::text[], $3::int[])"
                         " t(e, a, q)")
        self.mark_sql = f"UPDATE {s}.txn_events SET outcome = $2 WHERE event_id = ANY($1)"
        self.business_sql = (f"INSERT INTO {s}.business (event_id, aggregate, seq) "
                             f"SELECT event_id, aggregate, seq FROM {s}.txn_events "
                             "WHERE event_id = ANY($1)")
        self.projection_sql = (f"INSERT INTO {s}.projection (aggregate, last_seq) "
                               "SELECT unnest($1::text[]), 0 ON CONFLICT DO NOTHING")
        self.sent = 0

    async def _db(self, work: Callable[[asyncpg.Connection[asyncpg.Record]], Awaitable[_T]]) -> _T:
        """``work`` on a connection, retried through database faults (bounded: 10 min)."""
        deadline = time.monotonic() + 600
        while True:
            try:
                conn = await asyncpg.connect(self.args.dsn, timeout=10, server_settings={
                    "application_name": "torture-txn-producer"})
                try:
                    return await work(conn)
                finally:
                    await conn.close(timeout=5)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError,
                    TimeoutError) as exc:
                if time.monotonic() > deadline:
                    raise
                log.warning("txn producer: database %r, retrying", exc)
                await asyncio.sleep(0.3)

    async def _producer(self, writer: int) -> AIOKafkaProducer:
        while True:
            producer = AIOKafkaProducer(
                bootstrap_servers=self.args.bootstrap, acks="all", enable_idempotence=True,
                transactional_id=f"torture-tx-{writer}", request_timeout_ms=15_000,
                transaction_timeout_ms=30_000)
            try:
                await producer.start()
                return producer
            except (KafkaError, OSError) as exc:
                log.warning("txn producer %d: start %r, retrying", writer, exc)
                with contextlib.suppress(KafkaError, OSError):
                    await producer.stop()
                await asyncio.sleep(1)

    async def writer(self, w: int) -> None:
        gen = 0
        seqs: dict[str, int] = {}
        aborts = 0
        producer = await self._producer(w)
        try:
            while self.sent < self.args.events:
                started = time.monotonic()
                abort = self.rng.random() < ABORT_SHARE
                count = min(self.rng.randint(1, 4), self.args.events - self.sent)
                if abort:  # aggregates of their own: their sequence numbers are never due
                    aborts += 1
                    picks = [f"txa-{w}-{aborts}"] * count
                else:
                    picks = [f"tx-{w}-{gen}-{self.rng.randrange(AGGREGATES_PER_WRITER)}"
                             for _ in range(count)]
                batch = []
                for aggregate in picks:
                    seqs[aggregate] = seqs.get(aggregate, 0) + 1
                    batch.append((str(uuid.uuid4()), aggregate, seqs[aggregate]))
                ids = [b[0] for b in batch]
                await self._db(functools.partial(self._open, batch=batch))
                outcome, broken = await self._send(producer, batch, abort)
                if not abort and outcome != "committed":
                    gen += 1  # a gap, or maybe one: these aggregates take no more events
                if broken:  # the producer may be fenced or in an error state: a new one
                    with contextlib.suppress(KafkaError, OSError):
                        await producer.stop()
                    producer = await self._producer(w)
                await self._db(functools.partial(self._mark, ids=ids, outcome=outcome))
                if outcome != "aborted":
                    self.sent += count
                await asyncio.sleep(max(0.0, self.pace * count - (time.monotonic() - started)))
        finally:
            with contextlib.suppress(KafkaError, OSError):
                await producer.stop()

    async def _open(self, conn: asyncpg.Connection[asyncpg.Record],
                    batch: list[tuple[str, str, int]]) -> None:
        async with conn.transaction():
            await conn.execute(self.projection_sql, sorted({a for _, a, _ in batch}))
            await conn.execute(self.open_sql, *map(list, zip(*batch, strict=True)))

    async def _mark(self, conn: asyncpg.Connection[asyncpg.Record], ids: list[str],
                    outcome: str) -> None:
        async with conn.transaction():
            await conn.execute(self.mark_sql, ids, outcome)
            if outcome == "committed":
                await conn.execute(self.business_sql, ids)

    async def _send(self, producer: AIOKafkaProducer, batch: list[tuple[str, str, int]],
                    abort: bool) -> tuple[str, bool]:
        """(outcome, whether the producer must be replaced); the outcome is "committed",
        "aborted" or "unknown" (the commit itself failed)."""
        try:
            async with asyncio.timeout(60):
                await producer.begin_transaction()
                for event_id, aggregate, seq in batch:
                    await producer.send_and_wait(
                        self.args.topic, orjson.dumps({"aggregate": aggregate, "seq": seq}),
                        key=aggregate.encode(), headers=[
                            ("id", event_id.encode()), ("event_type", EVENT_TYPE.encode())])
        except (KafkaError, OSError, TimeoutError) as exc:
            log.warning("txn producer: send %r, aborting", exc)
            abort = True  # nothing was committed: abort whatever was sent
        if abort:
            try:
                async with asyncio.timeout(60):
                    await producer.abort_transaction()
            except (KafkaError, OSError, TimeoutError) as exc:
                # never committed: the coordinator aborts it (timeout, or the next producer
                # with this transactional id fences it); "unknown" gets a new producer
                log.warning("txn producer: abort %r", exc)
                return "aborted", True
            return "aborted", False
        try:
            async with asyncio.timeout(60):
                await producer.commit_transaction()
        except (KafkaError, OSError, TimeoutError) as exc:
            log.warning("txn producer: commit %r, outcome unknown", exc)
            return "unknown", True
        return "committed", False

    async def run(self) -> None:
        await asyncio.gather(*(self.writer(w) for w in range(WRITERS)))


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--dsn", "--bootstrap", "--schema", "--topic"):
        parser.add_argument(name, required=True)
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--seed", type=int, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(TxnProducer(args).run())


if __name__ == "__main__":
    main()
