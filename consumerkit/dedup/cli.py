"""``consumerkit dedup ...``: inspect and maintain a dedup table, check its window.

    consumerkit dedup partitions|maintain|check [--postgres DSN] [--schema S] [--table T]
        [--retention 7d] [--interval 1d] [--exact] [--kafka HOST:PORT] [--topic T ...]
        [--expired POLICY]

``partitions`` and ``maintain`` read the table's layout from the catalog, so they need no
``--layout``. ``check`` needs no database: it compares ``--retention`` with the topics'
retention and the default retry policy, and exits with 1 if the window is too short.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import asyncpg

from ..errors import ConsumerKitError
from .horizon import redelivery_horizon_check
from .layout import existing_layout
from .partitions import MaintenanceReport, PartitionInfo, list_partitions, maintain
from .policy import DedupPolicy

ACTIONS = ("partitions", "maintain", "check")
CONSUMER_HANDLER_TIMEOUT = 60.0  # Timeouts(handler=...) default, for the check


def add_arguments(parser: argparse.ArgumentParser,
                  policy_args: Callable[[argparse.ArgumentParser], None]) -> None:
    """The command's action and options; ``policy_args`` adds the dedup table's name,
    retention and interval, as for ``migrate`` and ``check``."""
    parser.add_argument("action", choices=ACTIONS)
    policy_args(parser)
    parser.add_argument("--exact", action="store_true",
                        help="partitions: count the rows (a full scan) instead of estimates")
    parser.add_argument("--kafka", help="check: the broker (HOST:PORT)")
    parser.add_argument("--topic", dest="topics", action="append",
                        help="check: a topic the consumers read (repeat for several)")
    parser.add_argument("--expired", choices=["dead_letter", "skip", "apply"],
                        default="dead_letter", help="check: the consumers' expired policy")


def policy_of(args: argparse.Namespace, layout: str = "partitioned") -> DedupPolicy:
    return DedupPolicy(retention=args.retention, partition_interval=args.interval,
                       table=args.table, expired=args.expired,
                       layout="table" if layout == "table" else "partitioned")


async def run(args: argparse.Namespace, conn: asyncpg.Connection[Any]) -> None:
    """``partitions`` or ``maintain``, for the layout the table has."""
    layout = await existing_layout(conn, args.schema, args.table)
    if layout is None:
        raise ConsumerKitError(
            f"no dedup table {args.schema}.{args.table}: run consumerkit migrate")
    if args.action == "maintain":
        report = await maintain(conn, args.schema, policy_of(args, layout))
        print(_maintained(layout, report))
        return
    parts = await list_partitions(conn, args.schema, args.table, exact=args.exact)
    print(_listing(parts, exact=args.exact, layout=layout))


async def check(args: argparse.Namespace) -> None:
    """Print the redelivery-horizon findings; fail if one is an error."""
    if not args.kafka or not args.topics:
        raise ConsumerKitError("dedup check needs --kafka and at least one --topic")
    findings = await redelivery_horizon_check(
        policy_of(args), topics=args.topics, kafka_bootstrap=args.kafka,
        handler_timeout=CONSUMER_HANDLER_TIMEOUT)
    for finding in findings:
        print(finding)
    if any(f.level == "error" for f in findings):
        raise ConsumerKitError("the dedup retention is shorter than a redelivery horizon")
    if not findings:
        print(f"the dedup retention ({args.retention}) covers every redelivery horizon found")


def _maintained(layout: str, report: MaintenanceReport) -> str:
    if layout == "table":
        rest = ("; a batch hit the lock timeout, the rest is left to the next run"
                if report.deferred else "")
        return f"deleted {report.deleted} expired event ids{rest}"
    return (f"created {report.created or 'none'}; dropped {report.dropped or 'none'}; "
            f"deferred {report.deferred or 'none'}")


def _listing(parts: list[PartitionInfo], *, exact: bool, layout: str) -> str:
    # a row holds the ids of one claim call: --exact also counts the ids themselves
    rows_title = "rows" if exact else "~rows"
    ids_title = f" {'ids':>10}" if exact else ""
    lines = [f"{'partition':<40} {'from':<26} {'to':<26} {rows_title:>10}{ids_title} "
             f"{'bytes':>12}"]
    for p in parts:
        rows = "?" if p.approx_rows is None else str(p.approx_rows)
        ids = f" {p.ids or 0:>10}" if exact else ""
        lower = "-" if p.lower is None else str(p.lower)
        upper = "-" if p.upper is None else str(p.upper)
        lines.append(f"{p.name:<40} {lower:<26} {upper:<26} {rows:>10}{ids} {p.size_bytes:>12}")
    total_rows = sum(p.approx_rows or 0 for p in parts)
    total_ids = f", {sum(p.ids or 0 for p in parts)} ids" if exact else ""
    total_bytes = sum(p.size_bytes for p in parts)
    what = "one table (table layout)" if layout == "table" else f"{len(parts)} partitions"
    lines.append(f"{what}, {total_rows} rows{total_ids}, {total_bytes / 1_048_576:.1f} MiB")
    return "\n".join(lines)
