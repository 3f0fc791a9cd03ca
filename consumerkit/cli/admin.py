"""``consumerkit dead-letters``, ``dedup`` and ``outbox``: inspect and maintain the tables."""

from __future__ import annotations

import argparse
import os

from ..deadletter.table import list_dead_letters
from ..dedup import cli as dedup_cli
from ..dedup.policy import DedupPolicy
from ..display import displayable
from ..outbox import cli as outbox_cli
from ..shared.identifiers import identifier
from .check import reach_broker
from .common import count, database_args, duration, policy_args, positive, sub, whole
from .errors import database

PREMAKE_MAX = 1000
"""The most outbox partitions made ahead."""


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    letters = database_args(sub(commands, "dead-letters", "list dead-lettered messages"))
    letters.add_argument("--consumer", help="only this consumer's (default: every consumer's)")
    letters.add_argument("--limit", type=count, default=50, help="rows listed, oldest first")
    letters.set_defaults(handler=dead_letters)
    dedup = database_args(sub(commands, "dedup",
                              "inspect or maintain the dedup table, check its window"))
    dedup_cli.add_arguments(dedup, policy_args)
    dedup.set_defaults(handler=dedup_command)
    outbox = database_args(sub(commands, "outbox",
                               "failed outbox rows, retry, skip, cleanup, maintain, migrate"))
    outbox_cli.add_arguments(outbox, duration)
    outbox.set_defaults(handler=outbox_command)
    for action in outbox._actions:  # row counts: a negative one is a usage error
        if action.dest == "limit":
            action.type = count
        elif action.dest == "batch":
            action.type = positive
        elif action.dest == "premake":  # each one a partition created, ahead of time
            action.type = whole(1, PREMAKE_MAX)


def dsn(args: argparse.Namespace) -> str | None:
    """``--postgres``, else ``$CONSUMERKIT_POSTGRES_DSN``."""
    return args.postgres or os.environ.get("CONSUMERKIT_POSTGRES_DSN")


async def dead_letters(args: argparse.Namespace) -> int:
    identifier(args.schema, "schema name")
    async with database(dsn(args)) as conn:
        entries = await list_dead_letters(conn, args.schema, args.consumer, args.limit)
    for e in entries:  # ids, types and details come from the records: shown escaped
        print(f"{e.failed_at:%Y-%m-%d %H:%M:%S} {displayable(e.consumer)} "
              f"{displayable(e.topic)}/{e.partition}/{e.offset} "
              f"id={displayable(e.event_id, 200)} type={displayable(e.event_type, 200)} "
              f"{displayable(e.reason)}: {displayable(e.detail, 2000)}")
    print(f"{len(entries)} dead letters")
    return 0


async def dedup_command(args: argparse.Namespace) -> int:
    DedupPolicy(retention=args.retention, partition_interval=args.interval, table=args.table)
    if args.action == "check":
        if args.kafka:  # an unreachable broker is an error, not an "unknown" retention
            await reach_broker(args.kafka, {})
        await dedup_cli.check(args)
        return 0
    identifier(args.schema, "schema name")
    async with database(dsn(args)) as conn:
        await dedup_cli.run(args, conn)
    return 0


async def outbox_command(args: argparse.Namespace) -> int:
    identifier(args.schema, "schema name")
    async with database(dsn(args)) as conn:
        await outbox_cli.run(args, conn)
    return 0


