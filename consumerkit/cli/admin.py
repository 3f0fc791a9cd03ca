"""``consumerkit dedup`` and ``outbox``: inspect and maintain the tables (``dead-letters``:
:mod:`.dead_letters`)."""

from __future__ import annotations

import argparse
import os

from ..dedup import cli as dedup_cli
from ..dedup.policy import DedupPolicy
from ..outbox import cli as outbox_cli
from ..shared.identifiers import identifier
from .check_broker import reach_broker
from .common import count, database_args, duration, policy_args, positive, sub, whole
from .errors import database

PREMAKE_MAX = 1000
"""The most outbox partitions made ahead."""


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dedup = database_args(sub(commands, "dedup",
                              "inspect or maintain the dedup table, check its window"))
    dedup_cli.add_arguments(dedup, policy_args)
    dedup.set_defaults(handler=dedup_command)
    outbox = database_args(sub(commands, "outbox",
                               "failed outbox rows, retry, skip, cleanup, maintain"))
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


