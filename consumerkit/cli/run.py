"""``consumerkit run MODULE:ATTR``: run a consumer until SIGTERM or SIGINT.

The settings (flags, ``CONSUMERKIT_*`` variables, ``.env``) fill what the consumer's code
leaves unset: the DSN, the bootstrap servers, the metrics port, the TLS and SASL options. A
value the code sets wins; a setting given for it anyway is reported in a warning. The first
signal drains in-flight work, commits and exits with 0; a second one abandons what is in
flight (rolled back, redelivered later).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from .. import _loop
from ..consumer import Consumer
from ..logs import configure_logging
from ..settings import ConsumerSettings, flag
from .common import run_until_signalled, sub
from .errors import check_database
from .options import add_settings_arguments, load_settings, sources
from .target import load_consumer

log = logging.getLogger("consumerkit.cli")

FILLED = ("postgres_dsn", "kafka_bootstrap", "metrics_port")
"""Consumer attributes the settings fill when the code leaves them ``None``."""
ATTRIBUTES = {"db_schema": "schema", "concurrency": "concurrency", "max_batch": "max_batch",
              "max_in_flight": "max_in_flight", "handler_timeout": "handler_timeout",
              "shutdown_timeout": "shutdown_timeout", "metrics_host": "metrics_host"}
"""Settings the code always sets: a setting given anyway is ignored, with a warning."""


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub(commands, "run", "run a consumer (MODULE:ATTR) until SIGTERM or SIGINT",
                 __doc__)
    parser.add_argument("target", metavar="MODULE:ATTR",
                        help="a Consumer, or a function (sync or async) returning one")
    add_settings_arguments(parser, ConsumerSettings)
    parser.set_defaults(handler=run_command)


def apply_settings(consumer: Consumer, settings: ConsumerSettings,
                   given: dict[str, str]) -> dict[str, str]:
    """Fill what ``consumer`` leaves unset from ``settings``; return where each of its
    values came from (``code`` or the setting's source)."""
    origin = {}
    if consumer.postgres_dsn is None:
        consumer.postgres_dsn = settings.dsn()
        origin["postgres_dsn"] = given["postgres_dsn"]
    if consumer.kafka_bootstrap is None:
        consumer.kafka_bootstrap = settings.kafka_bootstrap
        origin["kafka_bootstrap"] = given["kafka_bootstrap"]
    if consumer.metrics_port is None:
        consumer.metrics_port = settings.metrics_port
        origin["metrics_port"] = given["metrics_port"]
    if given["metrics_host"] != "default":
        consumer.metrics_host = settings.metrics_host
        origin["metrics_host"] = given["metrics_host"]
    for key, value in settings.kafka_options().items():
        if key not in consumer.kafka_options:
            consumer.kafka_options[key] = value
            consumer.kafka_consumer_options.setdefault(key, value)
    for name, attribute in ATTRIBUTES.items():
        if name in origin:
            continue
        origin.setdefault(name, "code")
        if given[name] != "default" and getattr(settings, name) != getattr(consumer, attribute):
            log.warning("%s (%s) ignored: the consumer's code sets %s=%r", flag(name),
                        given[name], attribute, getattr(consumer, attribute))
    for name in FILLED:
        origin.setdefault(name, "code")
    return origin


async def run_command(args: argparse.Namespace) -> int:
    settings = load_settings(args, ConsumerSettings)
    assert isinstance(settings, ConsumerSettings)
    configure_logging(settings.log_format, settings.log_level)
    consumer = await load_consumer(args.target)
    apply_settings(consumer, settings, sources(args, ConsumerSettings))
    await check_database(consumer.postgres_dsn)
    log.info("event loop: %s", _loop.report(settings.uvloop))
    consumer.handle_signals = True  # the process is ours: drain on the first, force on the next

    def on_signal(sig: signal.Signals, task: asyncio.Task[None]) -> None:
        if not consumer.started.is_set():  # still starting: nothing in flight to drain
            log.info("%s during start-up: stopping", sig.name)
            task.cancel()

    await run_until_signalled(consumer.run(), on_signal,
                              consumer.started if settings.gc_tuning else None)
    return 0
