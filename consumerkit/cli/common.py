"""What several commands share: sub-command parsers, value types, database options, and
running a service until a signal."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
import signal
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any, NoReturn

from ..shared import heap, signals

log = logging.getLogger("consumerkit.cli")
_DURATION = re.compile(r"(\d+)([dhm])")
_UNITS = {"d": "days", "h": "hours", "m": "minutes"}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows every option's default, and descriptions as written. A help text that states
    its default itself (a variable's name, never a secret's value) is left as it is."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.help and "(default:" in action.help:
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage error is one line (and exit status 2), not the whole
    usage: with the settings' flags that is twenty lines hiding the one that matters."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def sub(commands: argparse._SubParsersAction[argparse.ArgumentParser], name: str,
        summary: str, description: str | None = None) -> argparse.ArgumentParser:
    """A sub-command's parser, with ``--debug`` (also accepted before the command)."""
    text = (description or summary).replace("``", "")
    parser = commands.add_parser(name, help=summary, description=text,
                                 formatter_class=HelpFormatter)
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error (default: off)")
    return parser


def duration(text: str) -> timedelta:
    """``7d``, ``12h``, ``30m`` (or combinations such as ``1d12h``) as a timedelta."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: use e.g. 7d, 12h, 1d12h")
    total = timedelta()
    for number, unit in parts:
        total += timedelta(**{_UNITS[unit]: int(number)})
    return total


ROWS_MAX = 2**31 - 1
"""The most rows a limit, batch or page may name (PostgreSQL's ``int``)."""
PARTITION_MAX = 2**31 - 1
"""The highest Kafka partition number (an ``INT32`` on the wire)."""
PARTITIONS_MAX = 10_000
"""The most partitions ``topics create`` makes (a local or test broker's topic)."""
REPLICATION_MAX = 2**15 - 1
"""The highest Kafka replication factor (an ``INT16`` on the wire)."""


def whole(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high``; anything else is a usage
    error (exit 2) in one line."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:  # a float, a word, or past Python's 4300 digits
            shown = text if len(text) <= 40 else f"{text[:40]}... ({len(text)} characters)"
            raise argparse.ArgumentTypeError(f"not a whole number: {shown!r}") from None
        if not low <= value <= high:
            shown = str(value) if len(str(value)) <= 40 else f"a {len(str(value))}-digit number"
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}, got {shown}")
        return value
    return parse


count = whole(0, ROWS_MAX)
"""A row count, zero or more (a limit)."""
positive = whole(1, ROWS_MAX)
"""A row count, one or more (a batch, a page)."""
partition = whole(0, PARTITION_MAX)
"""A Kafka partition number."""


def database_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``--postgres-dsn`` (default ``$CONSUMERKIT_POSTGRES_DSN``, never shown) and
    ``--postgres-schema``, named as the settings name them, with their short forms."""
    parser.add_argument(
        "--postgres-dsn", "--postgres", dest="postgres", default=None,
        help="PostgreSQL DSN (default: $CONSUMERKIT_POSTGRES_DSN; never printed)")
    parser.add_argument(
        "--postgres-schema", "--schema", dest="schema",
        default=os.environ.get("CONSUMERKIT_POSTGRES_SCHEMA", "consumerkit"),
        help="the schema of consumerkit's tables ($CONSUMERKIT_POSTGRES_SCHEMA)")
    return parser


def policy_args(parser: argparse.ArgumentParser) -> None:
    """The dedup table's name, retention floor and partition interval."""
    parser.add_argument("--table", default="processed_events", help="the dedup table")
    parser.add_argument(
        "--retention", type=duration, default=timedelta(days=7),
        help="shortest retention to keep; a longer one registered by a consumer wins")
    parser.add_argument("--interval", type=duration, default=timedelta(days=1),
                        help="the dedup table's partition interval")


async def run_until_signalled(
    run: Coroutine[Any, Any, None],
    on_signal: Callable[[signal.Signals, asyncio.Task[None]], None],
    started: asyncio.Event | None = None,
) -> None:
    """Run ``run`` as a task, calling ``on_signal(sig, task)`` on SIGTERM/SIGINT meanwhile;
    a task cancelled by it (a forced stop) ends quietly, any other error is raised. Once
    ``started`` is set, the collector is tuned for the long run (:mod:`consumerkit.shared.heap`)."""
    task = asyncio.create_task(run)
    remove = signals.install(lambda sig: on_signal(sig, task))
    tune = asyncio.create_task(_tune_gc_once(started)) if started is not None else None
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        remove()
        if tune is not None:
            tune.cancel()


async def _tune_gc_once(started: asyncio.Event) -> None:
    await started.wait()
    log.info("garbage collector: %s", heap.tune_gc())
