"""``consumerkit offsets list | forget``: the offsets consumers keep in PostgreSQL
(``offset_store="postgres"``, the default).

With offsets in the database, the database says where a partition resumes, and an offset reset
made with Kafka's own tool (``kafka-consumer-groups --reset-offsets``) is not read while a row
is stored. To replay, or to skip ahead: stop the consumer, reset its group's offsets with
Kafka's tool, then ``forget`` its rows; on its next start each partition resumes from Kafka's
committed offset, and the rows are written again from there. ``forget`` refuses while the
group has members (a running consumer would write its rows back)."""

from __future__ import annotations

import argparse
import os

import asyncpg
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from ..offsets.postgres import TABLE
from ..shared.identifiers import check_name, qualified
from ..types import DbConnection
from .admin import dsn
from .common import count, database_args, sub
from .errors import CommandError, database

TIMEOUT_MS = 15_000


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    offsets = sub(commands, "offsets", "list or forget the offsets kept in PostgreSQL",
                  "The next offset of each partition, as consumers with "
                  "offset_store='postgres' (the default) keep it beside their effects. To "
                  "replay or skip records: stop the consumer, reset its group with "
                  "kafka-consumer-groups --reset-offsets, then forget its rows here.")
    actions = offsets.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = database_args(sub(actions, "list", "the stored offsets, by consumer and topic"))
    listing.add_argument("--consumer", help="only this consumer's (default: every consumer's)")
    listing.set_defaults(handler=list_command)
    forget = database_args(sub(
        actions, "forget", "delete a stopped consumer's rows, so it resumes from Kafka's "
        "committed offsets"))
    forget.add_argument("--consumer", required=True, help="the consumer (its group's name)")
    forget.add_argument("--topic", help="only this topic's rows")
    forget.add_argument("--partition", type=count, action="append", default=None,
                        help="only this partition's row (repeatable; needs --topic)")
    forget.add_argument(
        "--kafka", default=None, metavar="HOST:PORT",
        help="bootstrap servers, to check the group has no member "
             "(default: $CONSUMERKIT_KAFKA_BOOTSTRAP)")
    forget.set_defaults(handler=forget_command)


async def list_command(args: argparse.Namespace) -> int:
    table = qualified(args.schema, TABLE)
    async with database(dsn(args)) as conn:
        rows = await _rows(conn, table, args.consumer)
    for r in rows:
        last = f"{r['updated_at']:%Y-%m-%d %H:%M:%S}"
        print(f"{r['consumer_group']} {r['topic']}/{r['partition']}: next offset "
              f"{r['next_offset']} ({r['commits']} commits, last {last})")
    print(f"{len(rows)} stored offsets")
    return 0


async def _rows(conn: DbConnection, table: str, consumer: str | None) -> list[asyncpg.Record]:
    """The stored offsets (a missing table is the migrate hint, from ``database``)."""
    return list(await conn.fetch(
        'SELECT consumer_group, topic, "partition", next_offset, commits, updated_at '
        f"FROM {table} WHERE $1::text IS NULL OR consumer_group = $1 "
        'ORDER BY consumer_group, topic, "partition"', consumer))


async def forget_command(args: argparse.Namespace) -> int:
    group = check_name(args.consumer, "consumer name")
    if args.partition and not args.topic:
        raise CommandError("--partition needs --topic")
    table = qualified(args.schema, TABLE)
    bootstrap = args.kafka or os.environ.get("CONSUMERKIT_KAFKA_BOOTSTRAP")
    if not bootstrap:
        raise CommandError("no broker to check the group has no member: pass --kafka "
                           "HOST:PORT or set CONSUMERKIT_KAFKA_BOOTSTRAP")
    members = await group_members(bootstrap, group)
    if members:
        raise CommandError(f"consumer group {group!r} has {members} member(s): stop its "
                           "consumers first (a running consumer writes its rows back)")
    async with database(dsn(args)) as conn:
        await _rows(conn, table, group)  # a missing table: the migrate hint
        deleted = await conn.fetch(
            f'DELETE FROM {table} WHERE consumer_group = $1 AND ($2::text IS NULL OR '
            f'topic = $2) AND ($3::int[] IS NULL OR "partition" = ANY($3)) '
            'RETURNING topic, "partition", next_offset', group, args.topic, args.partition)
    for r in sorted(deleted, key=lambda r: (r["topic"], r["partition"])):
        print(f"forgot {group} {r['topic']}/{r['partition']} (was at {r['next_offset']})")
    print(f"{len(deleted)} stored offsets forgotten: {group} resumes from Kafka's committed "
          "offsets where none is stored")
    return 0


async def group_members(bootstrap: str, group: str) -> int:
    """How many members the consumer group has (0 for a group the broker does not know)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=TIMEOUT_MS)
    try:
        await admin.start()
        [response] = await admin.describe_consumer_groups([group])
    except (KafkaError, OSError) as exc:
        raise CommandError(f"cannot describe consumer group {group!r} on {bootstrap}: "
                           f"{exc}") from exc
    finally:
        await admin.close()
    for error_code, group_id, _state, *rest in response.groups:
        if group_id != group:
            continue
        if error_code:
            raise CommandError(f"cannot describe consumer group {group!r} on {bootstrap}: "
                               f"error code {error_code}")
        return len(rest[2])  # protocol_type, protocol, members
    return 0
