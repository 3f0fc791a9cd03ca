"""The ``consumerkit`` command line (also ``python -m consumerkit``).

One module per command: :mod:`.run`, :mod:`.relay`, :mod:`.config`, :mod:`.check`,
:mod:`.migrate`, :mod:`.admin` (dead letters, dedup, outbox), :mod:`.parked`,
:mod:`.asyncapi`; :mod:`.errors`
turns failures into one line, :mod:`.options` makes flags of the settings models.
"""

from __future__ import annotations

import argparse
import inspect
import logging
import os
import re
import sys
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..logs import configure_logging
from ..settings import SETTINGS, ConsumerSettings
from ..shared import aio
from ..shared.dsn import dsn_secrets
from . import (
    admin,
    asyncapi,
    check,
    config,
    dead_letters,
    dev,
    lookup,
    migrate,
    offsets,
    parked,
    relay,
    run,
    send,
    topics,
)
from .common import HelpFormatter, Parser, duration, sub
from .environment import load_dotenv_defaults
from .errors import database_error, one_line, scrub
from .options import load_settings

__all__ = ["duration", "main"]

DESCRIPTION = """\
consumerkit applies every Kafka event's effect exactly once, with a dedup row in the same
PostgreSQL transaction as the effect, and publishes a transactional outbox.

This command runs a consumer or an outbox relay, creates and checks what a deployment needs,
and inspects dead letters, parked keys, the dedup table and outboxes. Settings also come from
CONSUMERKIT_* variables and a .env file; see docs/configuration.md."""

EPILOG = """\
exit status: 0 on success, 1 on an error (one line on stderr: consumerkit: ...), 2 on a usage
error. --debug (before or after the command) shows the traceback of an error."""

KAFKA_CLIENT_LOGGER = "aiokafka"
DEMO_MAX_ORDERS = 100_000
_PASSWORD = re.compile(r"password\s*=\s*'?([^'\s]+)", re.IGNORECASE)


def _parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = Parser(
        prog="consumerkit", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=HelpFormatter)
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of an error")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run.add_parser(commands)
    relay.add_parser(commands)
    config.add_parser(commands)
    check.add_parser(commands)
    migrate.add_parser(commands)
    dead_letters.add_parser(commands)
    admin.add_parsers(commands)
    parked.add_parser(commands)
    offsets.add_parser(commands)
    topics.add_parser(commands)
    asyncapi.add_parser(commands)
    dev.add_parser(commands)
    send.add_parser(commands)
    lookup.add_parser(commands)
    demo = sub(commands, "demo", "run the pizza shop on embedded services: outbox, relays, "
               "three consumers, duplicates and two kills")
    demo.add_argument("--orders", default="500",
                      help=f"orders to place, 1 to {DEMO_MAX_ORDERS}")
    demo.add_argument("--broker", choices=("tansu", "kafka"), default="tansu",
                      help="the broker started for the run: Tansu (embedded, the default) or "
                           "three Apache Kafka brokers, one of them killed mid-run (needs "
                           "Java 17+ and Maven)")
    demo.add_argument("--kafka", help="use this broker instead of an embedded one")
    demo.add_argument("--postgres", help="use this database instead of an embedded one")
    demo.add_argument("--json", type=Path, metavar="FILE",
                      help="also write the closing table to FILE as JSON")
    demo.set_defaults(handler=_demo)
    return parser


def _demo(args: argparse.Namespace) -> int:
    orders = args.orders.strip()
    if not orders.isdigit() or not 1 <= int(orders) <= DEMO_MAX_ORDERS:
        print(f"consumerkit demo: --orders must be a whole number from 1 to "
              f"{DEMO_MAX_ORDERS}, not {args.orders!r}", file=sys.stderr)
        return 2
    if args.broker == "kafka" and args.kafka is not None:
        print("consumerkit demo: --broker kafka starts its own three brokers (to kill one); "
              "leave out --kafka", file=sys.stderr)
        return 2
    from ..demo import main as demo

    return demo(int(orders), args.kafka, args.postgres, args.json, args.broker)


def _secrets(args: argparse.Namespace) -> Iterator[str]:
    """Every password or secret the command may know of, to keep out of its output: those of
    its settings however given (flag, variable or ``.env``), each webhook header value on its
    own, and any password in a flag or ``CONSUMERKIT_*`` variable."""
    yield from _settings_secrets(args)
    values = [str(v) for v in vars(args).values() if isinstance(v, str)]
    values += [v for k, v in os.environ.items() if k.startswith("CONSUMERKIT_")]
    for value in values:
        yield from dsn_secrets(value)
        yield from _PASSWORD.findall(value)
    for name, value in os.environ.items():
        if name.startswith("CONSUMERKIT_") and name.endswith(("PASSWORD", "SECRETS")):
            yield value
    for name in ("sasl_plain_password", "ssl_password"):
        if isinstance(getattr(args, name, None), str):
            yield getattr(args, name)
    for header in getattr(args, "webhook_headers", None) or []:
        yield header.partition(":")[2].strip()
    yield from getattr(args, "webhook_secrets", None) or []


def _settings_secrets(args: argparse.Namespace) -> list[str]:
    """The secrets of the command's settings model, loaded as the command loads them (none
    when they do not load: that error names no value)."""
    runnable = getattr(args, "runnable", None) or args.command
    model = SETTINGS.get(runnable, ConsumerSettings if args.command == "check" else None)
    if model is None or not hasattr(args, "env_file"):
        return []
    try:
        return load_settings(args, model).secret_values()
    except Exception:  # reporting the first error matters more
        return []


def _uvloop_wanted(args: argparse.Namespace) -> bool:
    """The ``uvloop`` setting of ``run`` and ``relay`` (the long-running commands); the others
    keep the standard loop. Settings that do not load: the command reports that itself."""
    model = SETTINGS.get(args.command)
    if model is None:
        return False
    try:
        return load_settings(args, model).uvloop
    except Exception:  # reported by the command, in one line
        return True


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit status."""
    args = _parser().parse_args(argv)
    # those with --env-file read it as settings; the others' defaults come from variables
    if not hasattr(args, "env_file") and load_dotenv_defaults():
        args = _parser().parse_args(argv)
    if args.command not in ("run", "relay"):  # those two configure logging from settings
        configure_logging("text", "WARNING")
        # the command reports a broker it cannot reach in one line of its own
        logging.getLogger(KAFKA_CLIENT_LOGGER).setLevel(logging.CRITICAL)
    try:
        result = args.handler(args)
        if inspect.iscoroutine(result):
            result = aio.run(result, use_uvloop=_uvloop_wanted(args))
        return int(result)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        message = one_line(exc)
        dsn = getattr(args, "postgres", None)
        if message is None and isinstance(dsn, str):  # the demo connects by itself
            error = database_error(exc, dsn)
            message = None if error is None else str(error)
        if message is None and not args.debug:
            message = f"unexpected {type(exc).__name__}: {exc} (--debug shows the traceback)"
        secrets = list(_secrets(args))
        if args.debug:  # a library's words in the traceback may quote a secret too
            print(scrub(traceback.format_exc(), secrets), file=sys.stderr, end="")
        if message is not None:
            print(f"consumerkit: {scrub(message, secrets)}", file=sys.stderr)
        return 1
    finally:
        logging.shutdown()


if __name__ == "__main__":
    sys.exit(main())
