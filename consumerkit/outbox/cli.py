"""``consumerkit outbox ...``: failed rows, retry, skip, cleanup and maintenance.

    consumerkit outbox failed|retry|skip|cleanup|maintain [--postgres DSN]
        [--schema S] [--table T] [--id UUID ...] [--all] [--older-than 7d] [--batch N]
        [--limit N] [--retention 7d] [--interval 1d] [--premake N]

``--retention`` names an outbox kept in time partitions for change data capture
(:mod:`~consumerkit.outbox.retention`): ``maintain`` (which needs it) makes its partitions
ahead and drops those past it. The outbox tables are created by ``consumerkit migrate
--outbox-table T`` (``--outbox-only`` without the dedup tables, ``--outbox-retention`` and
``--outbox-cdc`` for change data capture, :mod:`~consumerkit.outbox.cdc`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from uuid import UUID

import asyncpg

from ..errors import ConsumerKitError
from .admin import (
    cleanup,
    count_failed,
    failed_events,
    maintain_outbox,
    retry_failed,
    skip_failed,
)
from .cdc import CdcSetup
from .retention import OutboxRetention
from .table import OutboxTable

ACTIONS = ("failed", "retry", "skip", "cleanup", "maintain")


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
    parser.add_argument("--retention", type=duration,
                        help="maintain: the events are kept this long in time partitions")
    parser.add_argument("--interval", type=duration, default=timedelta(days=1),
                        help="with --retention: the partitions' width")
    parser.add_argument("--premake", type=int, default=3,
                        help="with --retention: partitions made ahead")


async def run(args: argparse.Namespace, conn: asyncpg.Connection[Any]) -> None:
    retention = None if args.retention is None else OutboxRetention(
        args.retention, args.interval, args.premake)
    table = OutboxTable(args.schema, args.table, retention)
    if args.action == "maintain":
        if retention is None:
            raise ConsumerKitError("outbox maintain: pass --retention, e.g. 7d (rows older "
                                   "are dropped with their partition)")
        report = await maintain_outbox(conn, table)
        print(f"created {report.created or 'none'}; dropped {report.dropped or 'none'}; "
              f"deferred {report.deferred or 'none'}")
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


def cdc_line(setup: CdcSetup) -> str:
    """What the connector is to be configured with, after :func:`prepare_cdc`."""
    made = "created" if setup.created_slot else "already present"
    return (f"replication slot {setup.slot} (pgoutput) {made}, publication "
            f"{setup.publication}: configure the connector with slot.name={setup.slot}, "
            f"publication.name={setup.publication}")
