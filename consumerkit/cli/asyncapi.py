"""``consumerkit asyncapi MODULE:ATTR``: the AsyncAPI 3.0 document of an event catalog.

``MODULE:ATTR`` names an :class:`~consumerkit.catalog.EventCatalog` (what services receive
and send through their outboxes), a consumer (what it receives), or a function returning
either. The document goes to stdout, or to ``--output FILE``; it needs no service.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

from ..asyncapi import document
from ..catalog import EventCatalog
from ..consumer import Consumer
from .common import sub
from .errors import CommandError
from .target import load_target

EXPECTED = "an EventCatalog, a Consumer, nor a function returning one"


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub(commands, "asyncapi", "write the AsyncAPI 3.0 document of an event catalog "
                 "or a consumer", __doc__)
    parser.add_argument("target", metavar="MODULE:ATTR",
                        help="an EventCatalog, a Consumer, or a function returning one")
    parser.add_argument("--output", "-o", type=Path, metavar="FILE",
                        help="write the document to FILE (default: stdout)")
    parser.set_defaults(handler=asyncapi_command)


async def asyncapi_command(args: argparse.Namespace) -> int:
    value = await load_target(args.target, EventCatalog, Consumer, expected=EXPECTED)
    if isinstance(value, Consumer):
        value = EventCatalog.of(value)
    if not isinstance(value, EventCatalog):
        raise CommandError(f"{args.target} is a {type(value).__name__}, not {EXPECTED}")
    text = orjson.dumps(document(value), option=orjson.OPT_INDENT_2).decode() + "\n"
    if args.output is None:
        sys.stdout.write(text)
        return 0
    try:
        args.output.write_text(text)
    except OSError as exc:
        raise CommandError(f"cannot write {args.output}: {exc.strerror}") from None
    print(f"wrote the AsyncAPI document of {value.title!r} to {args.output}", file=sys.stderr)
    return 0
