"""``consumerkit outbox ...``: failed rows, retry, skip, cleanup and migration of an outbox.

    consumerkit outbox failed|retry|skip|cleanup|migrate [--postgres DSN] [--schema S]
        [--table T] [--id UUID ...] [--all] [--older-than 7d] [--batch N] [--limit N]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from uuid import UUID

import asyncpg

from ..errors import ConsumerKitError
from .admin import cleanup, count_failed, failed_events, retry_failed, skip_failed
from .table import OutboxTable, migrate_outbox

ACTIONS = ("failed", "retry", "skip", "cleanup", "migrate")


def add_arguments(parser: argparse.ArgumentParser,
                  duration: Callable[[str], timedelta]) -> None:
    parser.add_argument("action", choices=ACTIONS)
    parser.add_argument("--table", default="outbox", help="the outbox table")
    parser.add_argument("--id", dest="ids", action="append", type=UUID, default=None,
                        help="event id of a FAILED row (repeat for several)")
    parser.add_argument("--all", action="store_true", help="every FAILED row")
    parser.add_argument("--older-than", type=duration, help="cleanup: rows older than this")
    parser.add_argument("--batch", type=int, default=5000, help="cleanup: rows per transaction")
    parser.add_argument("--limit", type=int, default=100, help="failed: rows listed")


async def run(args: argparse.Namespace, conn: asyncpg.Connection[Any]) -> None:
    table = OutboxTable(args.schema, args.table)
    if args.action == "migrate":
        await migrate_outbox(conn, table)
        print(f"outbox {table.schema}.{table.table} is up to date")
    elif args.action == "failed":
        for e in await failed_events(conn, table, args.limit):
            print(f"{e.failed_at:%Y-%m-%d %H:%M:%S} {e.event_id} {e.event_type} "
                  f"{e.aggregate_type}/{e.aggregate_id} attempts={e.attempts}: {e.last_error}")
        print(f"{await count_failed(conn, table)} failed events")
    elif args.action in ("retry", "skip"):
        if bool(args.ids) == args.all:
            raise ConsumerKitError(f"outbox {args.action}: pass --id UUID (repeatable) or --all")
        act = retry_failed if args.action == "retry" else skip_failed
        n = await act(conn, args.ids, all_failed=args.all, table=table)
        print(f"{n} failed events {'retried' if args.action == 'retry' else 'skipped'}")
    else:
        if args.older_than is None:
            raise ConsumerKitError("outbox cleanup: pass --older-than, e.g. 7d")
        n = await cleanup(conn, args.older_than, table=table, batch=args.batch)
        print(f"{n} outbox rows deleted")
