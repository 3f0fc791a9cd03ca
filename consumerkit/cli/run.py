"""``consumerkit run MODULE:ATTR``: run a consumer until SIGTERM or SIGINT.

The settings (flags, ``CONSUMERKIT_*`` variables, ``.env``) give the consumer every option its
code left unchosen: the DSN, the bootstrap servers, the schema, the batch size, the metrics
port, the TLS and SASL options... A value the code gives a group (``Limits(max_batch=100)``)
wins; a setting given for it anyway is reported in a warning. The first
signal drains in-flight work, commits and exits with 0; a second one abandons what is in
flight (rolled back, redelivered later).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from ..consumer import Consumer
from ..logs import configure_logging
from ..settings import ConsumerSettings
from ..settings.precedence import resolve
from ..shared import aio
from .common import run_until_signalled, sub
from .errors import check_database
from .options import add_settings_arguments, load_settings, sources
from .target import load_consumer

log = logging.getLogger("consumerkit.cli")

def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub(commands, "run", "run a consumer (MODULE:ATTR) until SIGTERM or SIGINT",
                 __doc__)
    parser.add_argument("target", metavar="MODULE:ATTR",
                        help="a Consumer, or a function (sync or async) returning one")
    add_settings_arguments(parser, ConsumerSettings)
    parser.set_defaults(handler=run_command)


def apply_settings(consumer: Consumer, settings: ConsumerSettings,
                   given: dict[str, str]) -> dict[str, str]:
    """Give ``consumer`` every option its code left unchosen, from ``settings``
    (:func:`~consumerkit.settings.precedence.resolve`); returns where each setting's value
    came from: ``code`` or the setting's source (``default`` too)."""
    options, origin = resolve(consumer.options(), settings, given)
    consumer.set_options(**options)
    return origin


async def app_consumer(args: argparse.Namespace) -> Consumer:
    """The consumer ``--app`` names, with the settings applied as ``consumerkit run`` applies
    them, for a command that works on its behalf (a replay)."""
    settings = load_settings(args, ConsumerSettings)
    assert isinstance(settings, ConsumerSettings)
    consumer = await load_consumer(args.app)
    apply_settings(consumer, settings, sources(args, ConsumerSettings))
    return consumer


async def run_command(args: argparse.Namespace) -> int:
    settings = load_settings(args, ConsumerSettings)
    assert isinstance(settings, ConsumerSettings)
    configure_logging(settings.log_format, settings.log_level)
    consumer = await load_consumer(args.target)
    apply_settings(consumer, settings, sources(args, ConsumerSettings))
    await check_database(consumer.postgres_dsn)
    log.info("event loop: %s", aio.report(settings.uvloop))
    consumer.handle_signals = True  # the process is ours: drain on the first, force on the next

    def on_signal(sig: signal.Signals, task: asyncio.Task[None]) -> None:
        if not consumer.started.is_set():  # still starting: nothing in flight to drain
            log.info("%s during start-up: stopping", sig.name)
            task.cancel()

    await run_until_signalled(consumer.run(), on_signal,
                              consumer.started if settings.gc_tuning else None)
    return 0
