"""``consumerkit parked list | replay KEY | discard KEY``: the parked keys of consumers.

``list`` and ``discard`` need the database only. ``replay`` needs the consumer itself
(``--app MODULE:ATTR``, loaded as ``consumerkit run`` loads it, with the same settings): it
applies the parked records through the consumer's handlers.
"""

from __future__ import annotations

import argparse
import sys

import asyncpg

from ..display import displayable
from ..engine.replay import discard_key, replay_key
from ..errors import ParkingError
from ..parking import store
from ..settings import ConsumerSettings
from ..shared.identifiers import identifier
from .admin import dsn
from .common import count, database_args, partition, sub
from .errors import MIGRATE_HINT, CommandError, database
from .options import add_settings_arguments
from .run import app_consumer


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parked = sub(commands, "parked", "list, replay or discard parked keys",
                 "Keys parked by handlers with on_exhausted='park': list them, replay their "
                 "records in order through the consumer's handlers, or discard them (an audit "
                 "row says who, when and how many).")
    actions = parked.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = database_args(sub(actions, "list", "parked keys, oldest first"))
    listing.add_argument("--consumer", help="only this consumer's (default: every consumer's)")
    listing.add_argument("--limit", type=count, default=100, help="keys listed")
    listing.set_defaults(handler=list_command)
    replay = sub(actions, "replay", "apply a parked key's records in order, then unpark it")
    _key_args(replay)
    replay.add_argument("--app", required=True, metavar="MODULE:ATTR",
                        help="the consumer (as for consumerkit run) whose handlers apply them")
    add_settings_arguments(replay, ConsumerSettings)
    replay.set_defaults(handler=replay_command, runnable="run")
    discard = database_args(sub(actions, "discard",
                                "drop a parked key and its records (audited)"))
    _key_args(discard)
    discard.add_argument("--consumer", required=True, help="the consumer that parked it")
    discard.set_defaults(handler=discard_command)


def _key_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("key", metavar="KEY", help="the record key, as UTF-8 text")
    parser.add_argument("--topic", help="the key's topic, when it is parked on several")
    parser.add_argument("--partition", type=partition, help="the key's partition, likewise")


async def list_command(args: argparse.Namespace) -> int:
    identifier(args.schema, "schema name")
    async with database(dsn(args)) as conn:
        keys = await store.list_keys(conn, args.schema, args.consumer, limit=args.limit)
    for k in keys:  # keys and details come from the records: shown escaped
        print(f"{k.parked_at:%Y-%m-%d %H:%M:%S} {displayable(k.consumer)} "
              f"{displayable(k.topic)}/{k.partition} key={displayable(repr(k.key_text), 200)} "
              f"records={k.records} from offset {k.first_offset}: "
              f"{displayable(k.reason)}: {displayable(k.detail, 2000)}")
    print(f"{len(keys)} parked keys, {sum(k.records for k in keys)} records")
    return 0


async def discard_command(args: argparse.Namespace) -> int:
    identifier(args.schema, "schema name")
    async with database(dsn(args)) as conn:
        try:
            parked, dropped = await discard_key(conn, args.schema, args.consumer,
                                                args.key.encode(), args.topic, args.partition)
        except ParkingError as exc:
            raise CommandError(str(exc)) from None
    print(f"discarded key {parked.key_text!r} of {parked.topic}/{parked.partition}: {dropped} "
          "records dropped (recorded in parked_audit)")
    return 0


async def replay_command(args: argparse.Namespace) -> int:
    consumer = await app_consumer(args)
    try:
        report = await replay_key(consumer, args.key.encode(), args.topic, args.partition)
    except (asyncpg.UndefinedTableError, asyncpg.InvalidSchemaNameError) as exc:
        raise CommandError(f"{exc}: {MIGRATE_HINT}") from None
    except ParkingError as exc:
        raise CommandError(str(exc)) from None
    if report.key is None:
        action, actor, when = report.previously or ("?", "?", "?")
        print(f"key {args.key!r} is not parked (last {action} by {actor} at {when}): nothing "
              "to replay")
        return 0
    print(f"replayed key {report.key.key_text!r} of {report.key.topic}/{report.key.partition}:"
          f" {report.records} records ({report.applied} applied, {report.duplicates} "
          f"duplicates, {report.dead_lettered} dead-lettered, {report.skipped} skipped); the "
          "key is unparked", file=sys.stdout)
    return 0
