"""``consumerkit run MODULE:ATTR``: run a consumer until SIGTERM or SIGINT.

The settings (flags, ``CONSUMERKIT_*`` variables, ``.env``) give the consumer every value its
code left at the default: the DSN, the bootstrap servers, the schema, the batch size, the
metrics port, the TLS and SASL options... A value the code passes to ``Consumer(...)`` wins; a
setting given for it anyway is reported in a warning. The first
signal drains in-flight work, commits and exits with 0; a second one abandons what is in
flight (rolled back, redelivered later).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal

from ..consumer import Consumer
from ..logs import configure_logging
from ..settings import ConsumerSettings, flag
from ..shared import aio
from ..shared.identifiers import redact_dsn
from .common import run_until_signalled, sub
from .errors import check_database
from .options import add_settings_arguments, load_settings, sources
from .target import load_consumer

log = logging.getLogger("consumerkit.cli")

ARGUMENTS = {"postgres_dsn": "postgres_dsn", "kafka_bootstrap": "kafka_bootstrap",
             "db_schema": "schema", "concurrency": "concurrency", "max_batch": "max_batch",
             "max_in_flight": "max_in_flight", "handler_timeout": "handler_timeout",
             "shutdown_timeout": "shutdown_timeout", "metrics_port": "metrics_port",
             "metrics_host": "metrics_host", "stall_after_keys": "stall_after_keys",
             "stall_max_delay": "stall_max_delay", "offset_store": "offset_store",
             "unhandled": "unhandled", "ignore": "ignore",
             "postgres_pooler": "postgres_pooler"}
"""The settings that are :class:`Consumer` arguments: the setting's name, the argument's."""
UNSET_BY_NONE = frozenset({"postgres_dsn", "kafka_bootstrap", "metrics_port"})
"""Arguments whose ``None`` means "not given yet" (the settings fill them), even when passed
or set after the constructor."""


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub(commands, "run", "run a consumer (MODULE:ATTR) until SIGTERM or SIGINT",
                 __doc__)
    parser.add_argument("target", metavar="MODULE:ATTR",
                        help="a Consumer, or a function (sync or async) returning one")
    add_settings_arguments(parser, ConsumerSettings)
    parser.set_defaults(handler=run_command)


def code_chose(consumer: Consumer, argument: str) -> bool:
    """Whether the consumer's code chose ``argument`` (passed it to the constructor), rather
    than leaving it at its default."""
    if argument in UNSET_BY_NONE:
        return getattr(consumer, argument) is not None
    return argument in consumer.given


def settle_settings(consumer: Consumer, settings: ConsumerSettings,
                    given: dict[str, str]) -> dict[str, str]:
    """Give ``consumer`` every setting its code left at the default; a value the code chose
    wins, and a setting given for it anyway is reported in a warning. Returns where each of
    its values came from: ``code`` or the setting's source (``default`` too)."""
    origin = {}
    changes: dict[str, object] = {}
    for name, argument in ARGUMENTS.items():
        ours = getattr(consumer, argument)
        value = settings.dsn() if name == "postgres_dsn" else getattr(settings, name)
        if not code_chose(consumer, argument):
            origin[name] = given[name]
            if given[name] != "default":
                changes[argument] = value
            continue
        origin[name] = "code"
        if given[name] != "default" and value != ours:
            shown = repr(redact_dsn(ours) if name == "postgres_dsn" else ours)
            log.warning("%s (%s) ignored: the consumer's code passes %s=%s", flag(name),
                        given[name], argument, shown)
    chosen = consumer.given
    consumer.configure(**changes)
    consumer.given = chosen  # what the settings gave was not the code's choice
    return origin


def apply_settings(consumer: Consumer, settings: ConsumerSettings,
                   given: dict[str, str]) -> dict[str, str]:
    """:func:`settle_settings`, then the TLS and SASL options the code's Kafka options leave
    out."""
    origin = settle_settings(consumer, settings, given)
    for key, value in settings.kafka_options().items():
        if key not in consumer.kafka_options:
            consumer.kafka_options[key] = value
            consumer.kafka_consumer_options.setdefault(key, value)
    return origin


async def app_consumer(args: argparse.Namespace) -> Consumer:
    """The consumer ``--app`` names, with the settings applied as ``consumerkit run`` applies
    them, for a command that works on its behalf (a replay); its DSN from
    ``CONSUMERKIT_POSTGRES_DSN`` when neither the code nor a flag gave one."""
    settings = load_settings(args, ConsumerSettings)
    assert isinstance(settings, ConsumerSettings)
    consumer = await load_consumer(args.app)
    apply_settings(consumer, settings, sources(args, ConsumerSettings))
    if consumer.postgres_dsn is None:
        consumer.postgres_dsn = os.environ.get("CONSUMERKIT_POSTGRES_DSN")
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
