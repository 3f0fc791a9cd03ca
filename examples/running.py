"""Running a consumer: in the foreground, in the background of another program, several in
one process, and with its tables migrated by a separate deploy step."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import asyncpg

from consumerkit import Consumer, migrate


async def serve(consumer: Consumer) -> None:
    # until SIGTERM or SIGINT (graceful; a second signal cancels in-flight work),
    # or until another task calls consumer.stop()
    await consumer.run()


@contextlib.asynccontextmanager
async def running(consumer: Consumer) -> AsyncIterator[Consumer]:
    """Run ``consumer`` in the background for the body of an ``async with``."""
    task = asyncio.create_task(consumer.run())
    started = asyncio.create_task(consumer.started.wait())
    await asyncio.wait({task, started}, return_when=asyncio.FIRST_COMPLETED)
    if not started.done():
        started.cancel()
        task.result()  # re-raises the StartupError (or any other failure)
    try:
        yield consumer
    finally:
        await consumer.stop()
        await task


async def serve_all(consumers: list[Consumer]) -> None:
    # several consumers in one process: each SIGTERM or SIGINT reaches all of them; if one
    # of them fails, the task group cancels the others, which then shut down gracefully
    async with asyncio.TaskGroup() as group:
        for consumer in consumers:
            group.create_task(consumer.run())


async def migrate_only(consumer: Consumer, owner_dsn: str) -> None:
    # a deploy step, as the role owning the schema: create or upgrade the tables with the
    # consumer's own schema, dedup policy and outbox; the consumers then run with migrate=False
    conn = await asyncpg.connect(owner_dsn)
    try:
        outboxes = [] if consumer.outbox is None else [consumer.outbox.table]
        await migrate(conn, consumer.schema, consumer.dedup, namespace=consumer.name,
                      outboxes=outboxes)
    finally:
        await conn.close()


EVENT_FORMAT = (
    "%(asctime)s %(levelname)s %(handler)s %(event_id)s "
    "%(topic)s/%(partition)s/%(offset)s: %(message)s"
)


def configure_logging() -> None:
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # ctx.log records carry event_id, event_type, topic, partition, offset and handler
    events = logging.StreamHandler()
    events.setFormatter(logging.Formatter(EVENT_FORMAT))
    handler_log = logging.getLogger("consumerkit.handler")
    handler_log.addHandler(events)
    handler_log.propagate = False
