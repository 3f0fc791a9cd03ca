"""``consumerkit relay``: publish one outbox to Kafka (or a webhook) until SIGTERM or SIGINT.

Everything comes from the settings (flags, ``CONSUMERKIT_*`` variables, ``.env``). With
``--webhook-url`` each event is posted there instead of published to Kafka. The first signal
lets the batch in flight finish (its acknowledgements are recorded) and exits with 0; a second
one stops at once (the batch is published again later).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from ..errors import IdempotenceRefusedError
from ..logs import configure_logging
from ..outbox.kafka import KafkaSink
from ..outbox.relay import Relay
from ..outbox.sink import OutboxSink
from ..outbox.table import OutboxTable
from ..settings import RelaySettings, env_name, flag
from ..shared import aio
from .common import run_until_signalled, sub
from .errors import CommandError, database
from .options import add_settings_arguments, load_settings

log = logging.getLogger("consumerkit.cli")


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub(commands, "relay", "publish an outbox to Kafka or a webhook until SIGTERM",
                 __doc__)
    add_settings_arguments(parser, RelaySettings)
    parser.set_defaults(handler=relay_command)


def make_sink(settings: RelaySettings) -> OutboxSink:
    """A webhook sink when ``webhook_url`` is set, else a Kafka sink."""
    if settings.webhook_url is not None:
        from ..outbox.webhook import WebhookSink

        headers = {k: v.get_secret_value() for k, v in settings.webhook_headers.items()}
        secrets = [s.get_secret_value() for s in settings.webhook_secrets]
        return WebhookSink(settings.webhook_url, headers=headers, secrets=secrets or None,
                           timeout=settings.webhook_timeout)
    if settings.kafka.bootstrap is None:
        raise CommandError("no Kafka bootstrap servers: pass --kafka-bootstrap or set "
                           "CONSUMERKIT_KAFKA_BOOTSTRAP (or --webhook-url for a webhook)")
    options = {**settings.kafka.client_options(),
               "enable_idempotence": settings.enable_idempotence}
    return KafkaSink(settings.kafka.bootstrap, route=settings.route, kafka_options=options,
                     auto_create_topics=settings.auto_create_topics)


async def relay_command(args: argparse.Namespace) -> int:
    settings = load_settings(args, RelaySettings)
    assert isinstance(settings, RelaySettings)
    configure_logging(settings.log_format, settings.log_level)
    table = OutboxTable(settings.postgres.schema, settings.table)
    dsn = settings.dsn()
    async with database(dsn) as conn:
        if await conn.fetchval("SELECT to_regclass($1)",
                               f"{table.schema}.{table.table}") is None:
            raise CommandError(
                f"no outbox table {table.schema}.{table.table}: run `consumerkit migrate "
                f"--outbox-table {table.table}` (with the same --postgres and --schema) to "
                "create it")
    relay = Relay(settings.postgres, make_sink(settings), table=table.table,
                  batch_size=settings.batch_size, notify=settings.notify,
                  poll_interval=settings.poll_interval, name=settings.name,
                  handle_signals=False, metrics=settings.metrics)
    signals = 0

    def on_signal(sig: signal.Signals, task: asyncio.Task[None]) -> None:
        nonlocal signals
        signals += 1
        if signals == 1 and relay.started.is_set():
            log.info("%s received: finishing the batch in flight, then stopping", sig.name)
            relay.stop()
        else:
            log.warning("%s: stopping now", sig.name)
            task.cancel()

    log.info("event loop: %s", aio.report(settings.uvloop))
    try:
        await run_until_signalled(relay.run(), on_signal,
                                  relay.started if settings.gc_tuning else None)
    except IdempotenceRefusedError as exc:  # name the setting as this command spells it
        name = "enable_idempotence"
        raise CommandError(exc.advice(f"--no-{flag(name)[2:]} or {env_name(name)}=false")
                           ) from None
    return 0
