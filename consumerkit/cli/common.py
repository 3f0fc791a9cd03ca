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
from typing import Any

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


def count(text: str) -> int:
    """A whole number, zero or more (a row limit)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def positive(text: str) -> int:
    """A whole number, one or more."""
    value = count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def database_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``--postgres`` (default ``$CONSUMERKIT_POSTGRES_DSN``, never shown) and ``--schema``."""
    parser.add_argument(
        "--postgres", default=None,
        help="PostgreSQL DSN (default: $CONSUMERKIT_POSTGRES_DSN; never printed)")
    parser.add_argument("--schema", default=os.environ.get("CONSUMERKIT_SCHEMA", "consumerkit"),
                        help="the schema of consumerkit's tables ($CONSUMERKIT_SCHEMA)")
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
