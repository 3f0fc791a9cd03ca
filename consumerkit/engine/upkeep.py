"""A consumer's dedup table over its life: made ready at start (``synchronous_commit`` checked,
the tables migrated or only maintained), kept partitioned ahead while the consumer runs, with
the partitions' lead told to the observers; and the redelivery horizon checked at start."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import asyncpg

from ..dedup.horizon import redelivery_horizon_check
from ..dedup.partitions import maintain
from ..dedup.policy import DedupPolicy
from ..migration import migrate
from ..observability.observer import Observer
from ..outbox.admin import maintain_outbox
from ..outbox.replication import replication_slots
from ..outbox.table import OutboxTable
from ..outbox.writer import Outbox
from ..retry import RetryPolicy
from ..schema import check_synchronous_commit
from ..shared.aio import wait_set
from ..types import DbConnection
from .observing import partitions_ahead

log = logging.getLogger("consumerkit.consumer")


class DedupUpkeep:
    """The dedup table of consumer ``namespace`` in ``schema``, kept by ``pool``."""

    def __init__(self, pool: asyncpg.Pool, schema: str, dedup: DedupPolicy, namespace: str,
                 observer: Observer) -> None:
        self.pool = pool
        self.schema = schema
        self.dedup = dedup
        self.namespace = namespace
        self.observer = observer
        self.slots = False  # report the database's replication slots (it holds an outbox)
        self.outbox: OutboxTable | None = None

    async def prepare(self, *, auto_migrate: bool, outbox: Outbox | None) -> None:
        """Create or upgrade the tables (``auto_migrate``), else only make partitions."""
        self.slots = outbox is not None  # CDC reads an outbox through a slot on this database
        # an outbox kept for a retention: its partitions are maintained with the dedup table's
        self.outbox = outbox.table if outbox is not None and outbox.table.retention else None
        async with self.pool.acquire() as conn:
            if await check_synchronous_commit(conn) == "off":
                log.warning(
                    "PostgreSQL runs with synchronous_commit=off: a committed effect can vanish "
                    "after a crash while its offset is already committed (lost effect)")
            if auto_migrate:
                await migrate(conn, self.schema, self.dedup, namespace=self.namespace,
                              outboxes=[] if outbox is None else [outbox.table])
            else:
                await maintain(conn, self.schema, self.dedup, namespace=self.namespace)
            await self._report(conn)
        await self._maintain_outbox()

    async def run(self, interval: timedelta, wanted: asyncio.Event) -> None:
        """Create partitions ahead and drop expired ones every ``interval``, or at once when
        a claim found no partition for the current time (``wanted``); until cancelled."""
        while True:
            await wait_set(wanted, interval.total_seconds())
            wanted.clear()
            try:
                async with self.pool.acquire() as conn:
                    report = await maintain(conn, self.schema, self.dedup,
                                            namespace=self.namespace)
                    await self._report(conn)
                if report.created or report.dropped:
                    log.info("dedup partitions created %s, dropped %s", report.created,
                             report.dropped)
            except Exception:
                log.exception("dedup partition maintenance failed; retrying next interval")
            try:
                await self._maintain_outbox()
            except Exception:
                log.exception("outbox partition maintenance failed; retrying next interval")

    async def _maintain_outbox(self) -> None:
        if self.outbox is None:
            return
        async with self.pool.acquire() as conn:
            report = await maintain_outbox(conn, self.outbox)
        if report.created or report.dropped:
            log.info("outbox partitions created %s, dropped %s", report.created, report.dropped)

    async def _report(self, conn: DbConnection) -> None:
        self.observer.partitions_ahead(
            await partitions_ahead(conn, self.schema, self.dedup.table))
        if self.slots:
            try:
                self.observer.replication_slots(await replication_slots(conn))
            except asyncpg.PostgresError as exc:  # a role that may not read them: not fatal
                log.debug("replication slots not read: %s", exc)


async def check_horizon(
    dedup: DedupPolicy, *, topics: Sequence[str], kafka_bootstrap: str, retry: RetryPolicy,
    handler_timeout: float | None, kafka_options: Mapping[str, Any],
) -> None:
    """Warn when a redelivery (a reset to the start of a topic that keeps records longer
    than the dedup window) could bring back events the dedup table has forgotten."""
    findings = await redelivery_horizon_check(
        dedup, topics=topics, kafka_bootstrap=kafka_bootstrap, retry=retry,
        handler_timeout=handler_timeout, kafka_options=kafka_options)
    for finding in findings:
        if finding.level == "warning":
            log.warning("%s", finding.message)
        else:
            log.info("%s", finding.message)
