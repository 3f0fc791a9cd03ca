"""``consumerkit lookup EVENT_ID``: what the consumers did with an event, without SQL.

An event a consumer applied has its id in the dedup table (found through the id indexes, not
a scan); one it gave up on is in the dead letters, or parked with its key. A duplicate
delivery leaves no row of its own: it is absorbed because the applied one is there.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from ..deadletter.table import TABLE as DEAD_LETTERS
from ..dedup.ids import is_canonical_uuid
from ..dedup.names import TABLE as NAMES
from ..display import displayable
from ..parking.tables import RECORDS as PARKED
from ..shared.identifiers import identifier, qualified
from .admin import dsn
from .common import database_args, sub
from .errors import database


@dataclass(frozen=True, slots=True)
class Fate:
    """What one consumer did with the event: ``applied`` (by ``what``, a handler),
    ``dead-lettered`` or ``parked`` (``what``: the reason)."""

    consumer: str
    outcome: str
    at: datetime
    what: str


def show(fate: Fate) -> str:
    verb = {"applied": "applied by", "dead-lettered": "dead-lettered:",
            "parked": "parked:"}[fate.outcome]
    return f"{verb} {displayable(fate.what)} at {fate.at:%Y-%m-%d %H:%M:%S%z}"


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    lookup = database_args(sub(
        commands, "lookup", "what each consumer did with an event id: applied, "
        "dead-lettered or parked"))
    lookup.add_argument("event_id", metavar="EVENT_ID")
    lookup.add_argument("--consumer", help="only this consumer (default: every consumer)")
    lookup.add_argument("--table", default="processed_events", help="the dedup table")
    lookup.set_defaults(handler=lookup_command)


async def lookup_command(args: argparse.Namespace) -> int:
    async with database(dsn(args)) as conn:
        found = await fates(conn, args.schema, args.table, args.event_id, args.consumer)
    for fate in found:
        print(f"{displayable(fate.consumer)}: {show(fate)}")
    if not found:
        print(f"no consumer{'' if args.consumer is None else ' ' + displayable(args.consumer)} "
              f"applied, dead-lettered or parked {displayable(args.event_id)}")
        return 1
    return 0


async def fates(conn: asyncpg.Connection[Any], schema: str, table: str, event_id: str,
                consumer: str | None) -> list[Fate]:
    """Every consumer's (or ``consumer``'s) outcome for ``event_id``, oldest first."""
    identifier(schema, "schema name")
    column, value = (("uuids", "$1::uuid") if is_canonical_uuid(event_id)
                     else ("texts", '$1::text COLLATE "C"'))
    rows = await conn.fetch(f"""
        SELECT n.name AS consumer, 'applied' AS outcome, t.seen_at AS at, h.name AS what
          FROM {qualified(schema, table)} AS t
         CROSS JOIN LATERAL (SELECT x.name FROM {qualified(schema, NAMES)} AS x
                              WHERE x.id = t.namespace_key LIMIT 1) AS n
         CROSS JOIN LATERAL (SELECT x.name FROM {qualified(schema, NAMES)} AS x
                              WHERE x.id = t.handler_key LIMIT 1) AS h
         WHERE t.{column} @> ARRAY[{value}] AND ($2::text IS NULL OR n.name = $2)
        UNION ALL
        SELECT consumer, 'dead-lettered', failed_at, reason
          FROM {qualified(schema, DEAD_LETTERS)}
         WHERE event_id = $1::text AND ($2::text IS NULL OR consumer = $2)
        UNION ALL
        SELECT consumer, 'parked', parked_at, reason
          FROM {qualified(schema, PARKED)}
         WHERE event_id = $1::text AND replayed_at IS NULL
           AND ($2::text IS NULL OR consumer = $2)
         ORDER BY at""", event_id, consumer)
    return [Fate(r["consumer"], r["outcome"], r["at"], r["what"]) for r in rows]
