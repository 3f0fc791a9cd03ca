"""``consumerkit send`` and ``consumerkit lookup``: one event onto a topic from the command
line, and what the consumers did with an event id.

``send`` writes the record the outbox relay would: the key, the JSON payload as the value,
and the headers the consumer reads (``id``, ``event_type``, ``event_version``,
``occurred_at``). The id is a new UUIDv7 unless given: sending the same id again is a
duplicate, absorbed by the consumers. With ``--wait CONSUMER`` it then waits until that
consumer has applied, dead-lettered or parked the event, and says which.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from ..envelope import WireFormat
from ..outbox._uuid7 import uuid7
from .admin import dsn
from .common import database_args, positive, sub
from .errors import CommandError, database
from .lookup import Fate, fates, show
from .topics import topic_name

_WIRE = WireFormat()
_MAX_WAIT = 3600.0
_TIMEOUT_MS = 15_000


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= _MAX_WAIT:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most {_MAX_WAIT:g}")
    return value


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"write NAME=VALUE, not {text!r}")
    return name, value


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    send = database_args(sub(
        commands, "send", "publish one event to a topic, as the outbox relay would",
        "Publish one event (key, JSON payload, and the id, event_type, event_version and "
        "occurred_at headers); with --wait CONSUMER, wait for that consumer's outcome."))
    send.add_argument("topic", type=topic_name, metavar="TOPIC")
    send.add_argument("--type", dest="event_type", required=True, help="the event type")
    body = send.add_mutually_exclusive_group(required=True)
    body.add_argument("--payload", help="the payload, a JSON object")
    body.add_argument("--file", type=Path, help="read the JSON payload from this file "
                      "('-': standard input)")
    send.add_argument("--key", help="the record key (the aggregate id; default: none)")
    send.add_argument("--id", dest="event_id",
                      help="the event id (default: a new UUIDv7; an id sent before is a "
                           "duplicate)")
    send.add_argument("--version", type=positive, default=None,
                      help="the payload's schema version (event_version; default: absent, "
                           "read as 1)")
    send.add_argument("--header", dest="headers", action="append", type=_header, default=[],
                      metavar="NAME=VALUE", help="an extra header (repeat for several)")
    send.add_argument("--kafka", default=None, metavar="HOST:PORT",
                      help="bootstrap servers (default: $CONSUMERKIT_KAFKA_BOOTSTRAP)")
    send.add_argument("--wait", metavar="CONSUMER",
                      help="wait until this consumer applied, dead-lettered or parked it")
    send.add_argument("--timeout", type=_seconds, default=30.0,
                      help="seconds --wait waits")
    send.add_argument("--table", default="processed_events", help="the dedup table")
    send.set_defaults(handler=send_command)


def _payload(args: argparse.Namespace) -> bytes:
    if args.payload is not None:
        text, where = args.payload, "--payload"
    else:
        where = "standard input" if str(args.file) == "-" else str(args.file)
        try:
            text = sys.stdin.read() if str(args.file) == "-" else args.file.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"cannot read {where}: {getattr(exc, 'strerror', None) or exc}"
                               ) from None
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise CommandError(f"{where} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise CommandError(f"{where} must be a JSON object, not {type(value).__name__}")
    return orjson.dumps(value)


async def send_command(args: argparse.Namespace) -> int:
    bootstrap = args.kafka or os.environ.get("CONSUMERKIT_KAFKA_BOOTSTRAP")
    if not bootstrap:
        raise CommandError("no broker: pass --kafka HOST:PORT or set "
                           "CONSUMERKIT_KAFKA_BOOTSTRAP")
    value = _payload(args)
    event_id = args.event_id or str(uuid7())
    headers = [(_WIRE.id_header, event_id), (_WIRE.event_type_header, args.event_type),
               (_WIRE.occurred_at_header, datetime.now(UTC).isoformat())]
    if args.version is not None:
        headers.append((_WIRE.event_version_header, str(args.version)))
    headers += args.headers
    before: list[Fate] = []
    if args.wait:  # known before sending: a second send of an applied id is a duplicate
        async with database(dsn(args)) as conn:
            before = await fates(conn, args.schema, args.table, event_id, args.wait)
    # one record with a fixed id: a retried send is absorbed like any duplicate, so the
    # idempotent producer (which Tansu lacks) adds nothing here
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                request_timeout_ms=_TIMEOUT_MS)
    try:
        await producer.start()
        sent = await producer.send_and_wait(
            args.topic, value, key=args.key.encode() if args.key is not None else None,
            headers=[(name, text.encode()) for name, text in headers])
    except KafkaError as exc:
        raise CommandError(f"cannot send to {args.topic!r} on {bootstrap}: {exc}") from None
    finally:
        await producer.stop()
    print(f"sent {args.event_type} id={event_id} to {sent.topic}/{sent.partition} "
          f"at offset {sent.offset}")
    if not args.wait:
        return 0
    if before:
        print(f"{args.wait} already had it: {show(before[0])}; this one is a duplicate "
              "and is absorbed")
        return 0
    return await _wait(args, event_id)


async def _wait(args: argparse.Namespace, event_id: str) -> int:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + args.timeout
    async with database(dsn(args)) as conn:
        while True:
            if found := await fates(conn, args.schema, args.table, event_id, args.wait):
                print(f"{args.wait}: {show(found[0])}")
                return 0 if found[0].outcome == "applied" else 1
            if loop.time() > deadline:
                raise CommandError(f"{args.wait} has not applied, dead-lettered or parked "
                                   f"{event_id} after {args.timeout:g} s: is it running, and "
                                   f"does it read {args.topic}?")
            await asyncio.sleep(0.2)
