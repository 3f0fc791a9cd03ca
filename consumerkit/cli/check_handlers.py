"""``consumerkit check --handlers MODULE:ATTR``: would the code about to be deployed take the
events that wait for it?

Every parked record not yet replayed, every dead letter not yet replayed or discarded (a row
still in the table whose event id the consumer has not applied since) and every outbox row not
yet published goes through the new consumer's decoder, upcasters included, as it will at run
time. What would fail is listed with why; exit status 1 if anything would. Outbox rows of event
types the consumer has no handler for are meant for other services and only counted.

Read-only (every statement in a read-only transaction, nothing set for the session) and
bounded: the tables are read in pages of ``--page-size`` rows in key order, at most
``--max-records`` rows of each source, with a statement timeout, and only the first failures
of each source are printed in full.

With ``--try-handlers`` each handler then runs once, its statements prepared and never run
(:mod:`.try_handlers`), on the first of those records that decodes for it.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import asyncpg
import orjson

from ..consumer import Consumer
from ..deadletter.table import TABLE as DEAD_LETTERS
from ..deadletter.table import decode_headers
from ..dedup.postgres import PostgresDedupStore
from ..engine.decode import Decoder
from ..envelope import Record
from ..errors import DecodeError
from ..outbox.event import OutboxEvent
from ..outbox.kafka import wire_record
from ..outbox.table import OutboxTable
from ..parking.tables import RECORDS as PARKED
from ..shared.identifiers import qualified
from .common import positive
from .errors import CommandError, database
from .target import load_consumer
from .try_handlers import Trial, trial, try_handlers

SHOWN = 20  # failures printed in full per source; the rest are counted by reason
STATEMENT_TIMEOUT = "60s"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--handlers", metavar="MODULE:ATTR", default=None,
                        help="decode the parked records, dead letters and unpublished outbox "
                        "rows with this consumer's handlers and upcasters (default: not done)")
    parser.add_argument("--page-size", type=positive, default=500, metavar="N",
                        help="rows read per query by --handlers")
    parser.add_argument("--max-records", type=positive, default=1_000_000, metavar="N",
                        help="rows of each source read at most by --handlers")
    parser.add_argument("--try-handlers", action="store_true",
                        help="with --handlers: run each handler once, its statements prepared "
                        "and never executed, to find a missing table, column, schema or "
                        "privilege (runs the handlers' code: opt-in)")


def validate_handlers_arguments(args: argparse.Namespace) -> None:
    if args.try_handlers and args.handlers is None:
        raise CommandError("--try-handlers needs --handlers MODULE:ATTR (the consumer whose "
                           "handlers to try)")


class Findings(Protocol):
    """Where the lines go (``cli.check.Report``): each problem makes the exit status 1."""

    def ok(self, text: str) -> None: ...
    def note(self, text: str) -> None: ...
    def problem(self, text: str) -> None: ...


@dataclass
class Tally:
    """What one source gave: records read and decoded, failures by reason, the first ones."""

    source: str
    read: int = 0
    skipped: Counter[str] = field(default_factory=Counter)  # left out, by why
    failures: Counter[str] = field(default_factory=Counter)
    shown: list[str] = field(default_factory=list)
    stopped: bool = False


async def check_handlers(args: argparse.Namespace, dsn: str | None,
                         report: Findings) -> None:
    """Decode what waits in the database with the handlers of ``args.handlers``."""
    consumer = await load_consumer(args.handlers)
    decoder = consumer.decoder()
    outboxes = [consumer.outbox.table] if consumer.outbox is not None else []
    outboxes += [OutboxTable(consumer.schema, t) for t in args.outbox_tables or []
                 if not any(o.table == t for o in outboxes)]
    store = PostgresDedupStore(consumer.schema, consumer.dedup)  # where applied ids are
    # every statement runs in a read-only transaction of its own: nothing is set for the
    # session, which a transaction pooler would hand, read-only, to the service's clients
    async with database(dsn or consumer.postgres_dsn) as conn:

        async def replayed(record: Record) -> str | None:
            event_id = decoder.event_id(record)
            if event_id is None:
                return None
            async with conn.transaction(readonly=True):
                applied = await store.seen(conn, consumer.name, event_id)
            return "applied since (replayed)" if applied else None

        async def others(record: Record) -> str | None:
            raw = dict(record.headers).get(consumer.wire.event_type_header)
            mine = raw is not None and raw.decode(errors="replace") in consumer.routes.by_type
            return None if mine else "for other consumers' event types"

        pages = _Pages(conn, args.page_size, args.max_records)
        found: dict[str, Trial] = {}  # each handler's first waiting event that decodes
        tallies = [
            await _decode_all(f"parked records of {consumer.name}", decoder,
                              pages.parked(consumer), None, found),
            await _decode_all(f"dead letters of {consumer.name}", decoder,
                              pages.dead_letters(consumer), replayed, found),
        ]
        for table in outboxes:
            tallies.append(await _decode_all(
                f"unpublished rows of outbox {table.schema}.{table.table}", decoder,
                pages.outbox(table), others, found))
        for tally in tallies:
            _report(tally, args.page_size, args.max_records, report)
        if args.try_handlers:
            await try_handlers(consumer, conn, found, report)


Skip = Callable[[Record], Awaitable[str | None]]  # why a record is left out, or None


async def _decode_all(source: str, decoder: Decoder, records: _Paged,
                      skip: Skip | None, found: dict[str, Trial]) -> Tally:
    tally = Tally(source)
    async for where, record in records:
        why = None if skip is None else await skip(record)
        if why is not None:
            tally.skipped[why] += 1
            continue
        tally.read += 1
        try:
            decoded = decoder.decode(record)
        except DecodeError as exc:
            tally.failures[exc.reason] += 1
            if len(tally.shown) < SHOWN:
                tally.shown.append(f"{where}: {exc.reason}: {exc.detail}")
        else:
            found.setdefault(decoded.route.name, trial(f"{source}: {where}", decoded))
    tally.stopped = records.stopped
    return tally


def _report(tally: Tally, page_size: int, max_records: int, report: Findings) -> None:
    how = f"read in pages of {page_size}"
    if tally.stopped:
        report.note(f"{tally.source}: stopped after {max_records} rows (--max-records); the "
                    "rest were not checked")
    others = "".join(f"; {n} {why}" for why, n in tally.skipped.items())
    failed = sum(tally.failures.values())
    if not failed:
        report.ok(f"{tally.source}: {tally.read} decode with the new handlers ({how}{others})")
        return
    for line in tally.shown:
        report.problem(f"{tally.source}: {line}")
    reasons = ", ".join(f"{n} {reason}" for reason, n in tally.failures.most_common())
    more = f" ({failed - len(tally.shown)} not shown)" if failed > len(tally.shown) else ""
    report.problem(f"{tally.source}: {failed} of {tally.read} would fail with the new "
                   f"handlers: {reasons}{more} ({how}{others})")


@dataclass
class _Paged:
    """Rows of one query, page by page in key order: ``(where, record)``."""

    pages: _Pages
    sql: str
    args: tuple[Any, ...]
    make: Callable[[asyncpg.Record], tuple[str, Record]]
    stopped: bool = False

    async def __aiter__(self) -> AsyncIterator[tuple[str, Record]]:
        after, seen = -1, 0
        while True:
            async with self.pages.conn.transaction(readonly=True):
                await self.pages.conn.execute(
                    f"SET LOCAL statement_timeout = '{STATEMENT_TIMEOUT}'")
                rows = await self.pages.conn.fetch(self.sql, *self.args, after,
                                                   self.pages.size)
            for row in rows:
                if seen >= self.pages.limit:
                    self.stopped = True
                    return
                seen += 1
                yield self.make(row)
            if len(rows) < self.pages.size:
                return
            after = rows[-1]["k"]


@dataclass
class _Pages:
    conn: asyncpg.Connection[Any]
    size: int
    limit: int

    def parked(self, consumer: Consumer) -> _Paged:
        return _Paged(self, (
            'SELECT id AS k, topic, "partition", "offset", key, value, headers::text, '
            f"timestamp_ms FROM {qualified(consumer.schema, PARKED)} "
            "WHERE consumer = $1 AND replayed_at IS NULL AND id > $2 ORDER BY id LIMIT $3"),
            (consumer.name,), lambda r: _stored(r, r["timestamp_ms"]))

    def dead_letters(self, consumer: Consumer) -> _Paged:
        return _Paged(self, (
            'SELECT id AS k, topic, "partition", "offset", key, value, headers::text '
            f"FROM {qualified(consumer.schema, DEAD_LETTERS)} "
            "WHERE consumer = $1 AND id > $2 ORDER BY id LIMIT $3"),
            (consumer.name,), lambda r: _stored(r, None))

    def outbox(self, table: OutboxTable) -> _Paged:
        return _Paged(self, (
            "SELECT seq AS k, id, type, aggregatetype, aggregateid, payload::text, "
            f"occurred_at, headers::text FROM {table.events} "
            "WHERE seq > $1 ORDER BY seq LIMIT $2"), (), _outbox_row)


def _stored(row: asyncpg.Record, timestamp: int | None) -> tuple[str, Record]:
    where = f"{row['topic']}/{row['partition']}/{row['offset']}"
    return where, Record(row["topic"], row["partition"], row["offset"], row["key"],
                         row["value"], decode_headers(row["headers"]), timestamp=timestamp)


def _outbox_row(row: asyncpg.Record) -> tuple[str, Record]:
    """The record the relay would publish for ``row`` (its headers, key and value)."""
    event = OutboxEvent(row["k"], row["id"], row["type"], row["aggregatetype"],
                        row["aggregateid"], row["payload"].encode(), row["occurred_at"],
                        orjson.loads(row["headers"]))
    key, value, timestamp, headers = wire_record(event)
    return (f"seq {row['k']} (event {row['id']})",
            Record("", 0, row["k"], key, value, list(headers), timestamp=timestamp))
