"""The ``consumerkit`` command line.

    consumerkit demo [--orders N] [--kafka HOST:PORT] [--postgres DSN]
    consumerkit migrate [--postgres DSN] [--schema S] [--table T] [--retention 7d] [--interval 1d]
                        [--layout partitioned|table]
    consumerkit dedup partitions|maintain|check [--postgres DSN] [--schema S] [--table T]
        [--retention 7d] [--interval 1d] [--exact] [--kafka HOST:PORT] [--topic T ...]
        [--expired POLICY]
    consumerkit dead-letters [--postgres DSN] [--schema S] [--consumer NAME] [--limit N]
    consumerkit outbox failed|retry|skip|cleanup|migrate [--postgres DSN] [--schema S]
        [--table T] [--id UUID ...] [--all] [--older-than 7d] [--batch N] [--limit N]

The PostgreSQL DSN comes from ``--postgres`` or ``CONSUMERKIT_POSTGRES_DSN``; it is never
printed with its password.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta

import asyncpg

from ._identifiers import identifier, redact_dsn
from .deadletter.table import list_dead_letters
from .dedup import cli as dedup_cli
from .dedup.policy import DedupPolicy
from .errors import ConsumerKitError
from .outbox import cli as outbox_cli
from .schema import migrate

_DURATION = re.compile(r"(\d+)([dhm])")
_UNITS = {"d": "days", "h": "hours", "m": "minutes"}


def duration(text: str) -> timedelta:
    """``7d``, ``12h``, ``30m`` (or combinations such as ``1d12h``) as a timedelta."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: use e.g. 7d, 12h, 1d12h")
    total = timedelta()
    for number, unit in parts:
        total += timedelta(**{_UNITS[unit]: int(number)})
    return total


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="consumerkit", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run the duplicate-laden demo on embedded services")
    demo.add_argument("--orders", type=int, default=500)
    demo.add_argument("--kafka", help="use this broker instead of an embedded one")
    demo.add_argument("--postgres", help="use this database instead of an embedded one")
    migrate_ = _database_args(commands.add_parser(
        "migrate", help="create or upgrade consumerkit's tables"))
    _policy_args(migrate_)
    migrate_.add_argument("--layout", choices=["partitioned", "table"], default="partitioned",
                          help="the dedup table's layout (when it is created)")
    letters = _database_args(commands.add_parser(
        "dead-letters", help="list dead-lettered messages"))
    letters.add_argument("--consumer")
    letters.add_argument("--limit", type=int, default=50)
    dedup_cli.add_arguments(_database_args(commands.add_parser(
        "dedup", help="inspect or maintain the dedup table, check its window")), duration)
    outbox_cli.add_arguments(_database_args(commands.add_parser(
        "outbox", help="failed outbox rows, retry, skip, cleanup, migrate")), duration)
    return parser


def _database_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--postgres", default=os.environ.get("CONSUMERKIT_POSTGRES_DSN"),
                        help="DSN (default: $CONSUMERKIT_POSTGRES_DSN)")
    parser.add_argument("--schema", default="consumerkit")
    return parser


def _policy_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--table", default="processed_events")
    parser.add_argument(
        "--retention", type=duration, default=timedelta(days=7),
        help="shortest retention to keep; a longer one registered by a consumer wins")
    parser.add_argument("--interval", type=duration, default=timedelta(days=1))


def _policy(args: argparse.Namespace) -> DedupPolicy:
    return DedupPolicy(retention=args.retention, partition_interval=args.interval,
                       table=args.table, layout=getattr(args, "layout", "partitioned"))


async def _with_connection(args: argparse.Namespace,
                           work: Callable[[asyncpg.Connection], Awaitable[None]]) -> None:
    if not args.postgres:
        raise ConsumerKitError("no database: pass --postgres or set CONSUMERKIT_POSTGRES_DSN")
    identifier(args.schema, "schema name")
    if hasattr(args, "retention"):
        _policy(args)  # validates the table name, retention and interval before connecting
    try:
        conn = await asyncpg.connect(args.postgres, timeout=15)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        raise ConsumerKitError(
            f"cannot connect to {redact_dsn(args.postgres)}: {type(exc).__name__}") from None
    try:
        await work(conn)
    finally:
        await conn.close()


async def _migrate(args: argparse.Namespace) -> None:
    async def work(conn: asyncpg.Connection) -> None:
        await migrate(conn, args.schema, _policy(args))
        print(f"schema {args.schema} is up to date")
    await _with_connection(args, work)


async def _dedup(args: argparse.Namespace) -> None:
    if args.action == "check":
        _policy(args)  # validates the retention and interval
        await dedup_cli.check(args)
        return

    async def work(conn: asyncpg.Connection) -> None:
        await dedup_cli.run(args, conn)
    await _with_connection(args, work)


async def _dead_letters(args: argparse.Namespace) -> None:
    async def work(conn: asyncpg.Connection) -> None:
        entries = await list_dead_letters(conn, args.schema, args.consumer, args.limit)
        for e in entries:
            print(f"{e.failed_at:%Y-%m-%d %H:%M:%S} {e.consumer} {e.topic}/{e.partition}/"
                  f"{e.offset} id={e.event_id} type={e.event_type} {e.reason}: {e.detail}")
        print(f"{len(entries)} dead letters")
    await _with_connection(args, work)


async def _outbox(args: argparse.Namespace) -> None:
    async def work(conn: asyncpg.Connection) -> None:
        await outbox_cli.run(args, conn)
    await _with_connection(args, work)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "demo":
        from .demo import main as demo

        return demo(args.orders, args.kafka, args.postgres)
    command = {"migrate": _migrate, "dedup": _dedup, "dead-letters": _dead_letters,
               "outbox": _outbox}
    try:
        asyncio.run(command[args.command](args))
    except ConsumerKitError as exc:
        print(f"consumerkit: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
