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
from collections.abc import Mapping
from typing import Any

import asyncpg
from aiokafka import TopicPartition
from aiokafka.errors import GroupIdNotFound, KafkaError, for_code

from ..offsets.postgres import TABLE
from ..settings import ConsumerSettings
from ..shared.identifiers import check_name, qualified
from ..transport.kafka_admin import admin_client
from ..types import DbConnection
from .admin import dsn
from .check import SERVICE_FIELDS
from .common import database_args, partition, sub
from .errors import CommandError, database
from .options import add_settings_arguments, load_settings

TIMEOUT = 15.0


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    offsets = sub(commands, "offsets", "list or forget the offsets kept in PostgreSQL",
                  "The next offset of each partition, as consumers with "
                  "offset_store='postgres' (the default) keep it beside their effects. To "
                  "replay or skip records: stop the consumer, reset its group with "
                  "kafka-consumer-groups --reset-offsets, then forget its rows here.")
    actions = offsets.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = database_args(sub(actions, "list", "the stored offsets, by consumer and topic"))
    listing.add_argument("--consumer", default=None, metavar="NAME",
                         help="only this consumer's (default: every consumer's)")
    listing.set_defaults(handler=list_command)
    forget = sub(actions, "forget", "delete a stopped consumer's rows, so it resumes from "
                 "Kafka's committed offsets")
    forget.add_argument("--consumer", required=True, metavar="NAME",
                        help="the consumer (its group's name); required")
    forget.add_argument("--topic", default=None, metavar="T",
                        help="only this topic's rows (default: every topic's)")
    forget.add_argument("--partition", type=partition, action="append", default=None,
                        metavar="N", help="only this partition's row, repeatable, with "
                        "--topic (default: every partition's)")
    add_settings_arguments(forget, ConsumerSettings, only=SERVICE_FIELDS)
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
    settings = load_settings(args, ConsumerSettings)
    assert isinstance(settings, ConsumerSettings)
    table = qualified(settings.postgres.schema, TABLE)
    bootstrap = settings.kafka.bootstrap
    if not bootstrap:
        raise CommandError("no broker to check the group has no member: pass --kafka "
                           "HOST:PORT or set CONSUMERKIT_KAFKA_BOOTSTRAP")
    async with _Group(bootstrap, settings.kafka.client_options(), group) as kafka:
        if members := await kafka.members():
            raise CommandError(f"consumer group {group!r} has {members} member(s): stop its "
                               "consumers first (a running consumer writes its rows back)")
        async with database(settings.dsn()) as conn:
            try:
                deleted = await conn.fetch(
                    f'DELETE FROM {table} WHERE consumer_group = $1 AND ($2::text IS NULL OR '
                    f'topic = $2) AND ($3::int[] IS NULL OR "partition" = ANY($3)) '
                    'RETURNING topic, "partition", next_offset', group, args.topic,
                    args.partition)
            except asyncpg.InsufficientPrivilegeError as exc:
                raise CommandError(f"{exc}: forget needs DELETE on {table} (run it as the "
                                   "role that ran consumerkit migrate)") from None
        forgotten = sorted((r["topic"], r["partition"], r["next_offset"]) for r in deleted)
        committed = await kafka.offsets([TopicPartition(t, p) for t, p, _ in forgotten])
        for topic, partition, was in forgotten:
            resumes = committed.get(TopicPartition(topic, partition), -1)
            then = (f"Kafka's committed offset {resumes}" if resumes >= 0 else
                    "no committed offset in Kafka: auto_offset_reset decides")
            print(f"forgot {group} {topic}/{partition} (was at {was}): resumes from {then}")
        print(f"{len(forgotten)} stored offsets forgotten")
        if members := await kafka.members():
            print(f"WARNING: consumer group {group!r} gained {members} member(s) meanwhile: "
                  "they may have written rows back (consumerkit offsets list)")
    return 0


class _Group:
    """One consumer group on the broker, through one admin client."""

    def __init__(self, bootstrap: str, options: Mapping[str, Any], group: str) -> None:
        self.bootstrap, self.group = bootstrap, group
        self.admin = admin_client(bootstrap, options, TIMEOUT)

    async def __aenter__(self) -> _Group:
        try:
            await self.admin.start()
        except (KafkaError, OSError) as exc:
            await self.admin.close()
            raise self._error(exc) from exc
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.admin.close()

    def _error(self, cause: object) -> CommandError:
        return CommandError(f"cannot describe consumer group {self.group!r} on "
                            f"{self.bootstrap}: {cause}")

    async def members(self) -> int:
        """How many members the group has (0 for a group the broker does not know)."""
        try:
            [response] = await self.admin.describe_consumer_groups([self.group])
        except (KafkaError, OSError) as exc:
            raise self._error(exc) from exc
        for error_code, group_id, _state, *rest in response.groups:
            if group_id != self.group or for_code(error_code) is GroupIdNotFound:
                continue
            if error_code:
                raise self._error(for_code(error_code).__name__)
            return len(rest[2])  # protocol_type, protocol, members
        return 0

    async def offsets(self, parts: list[TopicPartition]) -> dict[TopicPartition, int]:
        """The group's committed offsets in Kafka for ``parts`` (-1: none)."""
        if not parts:
            return {}
        try:
            found = await self.admin.list_consumer_group_offsets(self.group, partitions=parts)
        except (KafkaError, OSError) as exc:
            raise CommandError(f"forgot the rows, but cannot read {self.group!r}'s committed "
                               f"offsets on {self.bootstrap}: {exc}") from exc
        return {tp: meta.offset for tp, meta in found.items()}
