"""``consumerkit dead-letters [list] | show ID | replay | discard``: the dead-letter table.

``list``, ``show`` and ``discard`` need the database only. ``replay`` needs the consumer
itself (``--app MODULE:ATTR``, loaded as ``consumerkit run`` loads it, with the same
settings): it applies the entries through the consumer's handlers
(:mod:`consumerkit.engine.dead_letters`). Everything taken from a record (ids, types, keys,
details, payloads, headers) is shown escaped (:mod:`consumerkit.display`).
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable
from datetime import UTC, datetime
from typing import TypeVar

import asyncpg

from ..deadletter import store
from ..deadletter.store import STATUSES, WAITING, DeadLetterFilter, StoredDeadLetter
from ..display import displayable
from ..engine.dead_letters import discard_dead_letters, replay_dead_letters
from ..errors import DeadLetterError
from ..settings import ConsumerSettings
from ..shared.identifiers import identifier
from .admin import dsn
from .common import count, database_args, duration, partition, positive, sub
from .dead_letters_show import dry_run, show_entry
from .errors import MIGRATE_HINT, CommandError, database
from .options import add_settings_arguments
from .run import app_consumer

T = TypeVar("T")


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    letters = sub(commands, "dead-letters", "list, show, replay or discard dead letters",
                  "Dead-lettered messages: list them (the default), show one decoded, replay "
                  "them through the consumer's handlers after a fix (in per-key order, "
                  "once), or discard them. Replayed and discarded entries are kept, marked "
                  "with when, by which database role and the --note.")
    _list_args(letters)
    actions = letters.add_subparsers(dest="action", required=False, metavar="ACTION")
    _list_args(sub(actions, "list", "waiting dead letters, oldest first"))
    show = database_args(sub(actions, "show", "one dead letter, its payload and headers"))
    show.add_argument("id", metavar="ID", type=positive, help="the entry's id (see list)")
    show.set_defaults(handler=show_command)
    replay = sub(actions, "replay", "apply dead letters again through the consumer")
    replay.add_argument("--app", required=True, metavar="MODULE:ATTR",
                        help="the consumer (as for consumerkit run) whose handlers apply them")
    _filter_args(replay, consumer="only this consumer's (default: the app's consumer)")
    replay.add_argument("--note", help="why, kept with each entry replayed (default: none)")
    replay.add_argument("--dry-run", action="store_true",
                        help="decode the entries and write nothing (default: off)")
    replay.add_argument("--try-handlers", action="store_true",
                        help="with --dry-run: run each entry's handler with its statements "
                             "checked, never run (default: off)")
    add_settings_arguments(replay, ConsumerSettings)
    replay.set_defaults(handler=replay_command, runnable="run")
    discard = database_args(sub(actions, "discard", "mark dead letters discarded (kept)"))
    _filter_args(discard, consumer="only this consumer's")
    discard.add_argument("--note", help="why, kept with each entry (default: none)")
    discard.set_defaults(handler=discard_command)


def _list_args(parser: argparse.ArgumentParser) -> None:
    database_args(parser)
    _filter_args(parser, consumer="only this consumer's (default: every consumer's)",
                 limit=50)
    parser.add_argument("--all", action="store_true",
                        help="include the replayed and discarded ones (default: off)")
    parser.set_defaults(handler=list_command)


def _filter_args(parser: argparse.ArgumentParser, consumer: str,
                 limit: int | None = None) -> None:
    parser.add_argument("--consumer", help=consumer)
    parser.add_argument("--reason", help="only this reason, e.g. handler_failed (default: any)")
    parser.add_argument("--event-type", help="only this event type (default: any)")
    parser.add_argument("--topic", help="only this topic (default: any)")
    parser.add_argument("--partition", type=partition, help="only this partition (default: any)")
    parser.add_argument("--id", type=positive, action="append", dest="ids", metavar="ID",
                        help="only this entry; repeat for several (default: any)")
    parser.add_argument("--since", type=moment, help="failed at or after: an ISO time "
                        "(UTC unless it says) or a duration ago, e.g. 2h (default: any)")
    parser.add_argument("--until", type=moment, help="failed before, likewise (default: any)")
    taken = ("entries taken, in their original order (topic, partition, offset)"
             if limit is None else "entries listed, oldest first")
    parser.add_argument("--limit", type=count, default=limit,
                        help=f"{taken} (default: {'all' if limit is None else limit})")


def moment(text: str) -> datetime:
    """An ISO 8601 time (UTC unless it names its zone) or a duration ago (``2h``, ``1d``)."""
    if text and text[-1] in "smhdw" and text[0].isdigit():
        return datetime.now(UTC) - duration(text)
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid time {text[:40]!r}: use e.g. 2026-11-29T03:00 or 2h") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def chosen(args: argparse.Namespace) -> DeadLetterFilter:
    return DeadLetterFilter(
        consumer=args.consumer, reason=args.reason, event_type=args.event_type,
        topic=args.topic, partition=args.partition, ids=tuple(args.ids or ()),
        since=args.since, until=args.until, limit=args.limit)


async def list_command(args: argparse.Namespace) -> int:
    identifier(args.schema, "schema name")
    statuses = STATUSES if args.all else (WAITING,)
    async with database(dsn(args)) as conn:
        entries = await _tables(store.select(conn, args.schema, chosen(args), statuses,
                                             by_position=False))
    for e in entries:
        print(line(e))
    print(f"{len(entries)} dead letters" + ("" if args.all else " waiting"))
    return 0


def line(stored: StoredDeadLetter) -> str:
    """One entry in one line, its record's text escaped."""
    e = stored.entry
    text = (f"#{stored.id} {e.failed_at:%Y-%m-%d %H:%M:%S} {displayable(e.consumer)} "
            f"{displayable(e.topic)}/{e.partition}/{e.offset} "
            f"id={displayable(e.event_id, 200)} type={displayable(e.event_type, 200)} "
            f"{displayable(e.reason)}: {displayable(e.detail, 2000)}")
    if stored.status != WAITING:
        text += f" [{stored.status} by {displayable(stored.resolved_by)} at " \
                f"{stored.resolved_at:%Y-%m-%d %H:%M:%S}]"
    elif stored.last_replay_error is not None:
        text += (f" [replay failed {stored.replay_attempts}x: "
                 f"{displayable(stored.last_replay_error, 500)}]")
    return text


async def show_command(args: argparse.Namespace) -> int:
    identifier(args.schema, "schema name")
    async with database(dsn(args)) as conn:
        stored = await _tables(store.fetch(conn, args.schema, args.id))
    if stored is None:
        raise CommandError(f"no dead letter #{args.id} in schema {args.schema}")
    print(show_entry(stored))
    return 0


async def discard_command(args: argparse.Namespace) -> int:
    identifier(args.schema, "schema name")
    which = chosen(args)
    if which == DeadLetterFilter(limit=which.limit):
        raise CommandError("discard needs at least one filter (--consumer, --id, --reason, "
                           "...): without one it would discard every dead letter")
    async with database(dsn(args)) as conn:
        try:
            ids = await _tables(discard_dead_letters(conn, args.schema, which, note=args.note))
        except DeadLetterError as exc:
            raise CommandError(str(exc)) from None
    print(f"discarded {len(ids)} dead letters (kept, marked discarded)")
    return 0


async def replay_command(args: argparse.Namespace) -> int:
    consumer = await app_consumer(args)
    if args.try_handlers and not args.dry_run:
        raise CommandError("--try-handlers goes with --dry-run")
    try:
        if args.dry_run:
            return await _tables(dry_run(consumer, chosen(args), args.try_handlers))
        report = await _tables(replay_dead_letters(consumer, chosen(args), note=args.note))
    except DeadLetterError as exc:
        raise CommandError(str(exc)) from None
    for failure in report.failures:
        print(f"not replayed: {failure}")
    print(f"{report.chosen} dead letters: {report.replayed} replayed, {report.duplicates} "
          f"applied before (marked replayed), {report.failed} failed again (kept waiting), "
          f"{report.held_back} held back behind an earlier entry of their key, {report.gone} "
          "replayed or discarded meanwhile")
    return 1 if report.failed or report.held_back else 0


async def _tables(work: Awaitable[T]) -> T:
    """``await work``, a missing table or column (not migrated) said in one line."""
    try:
        return await work
    except (asyncpg.UndefinedTableError, asyncpg.UndefinedColumnError,
            asyncpg.InvalidSchemaNameError) as exc:
        raise CommandError(f"{exc}: {MIGRATE_HINT}") from None
