"""Fixtures for the Debezium tests: a PostgreSQL with ``wal_level=logical``, an Apache Kafka at
the version Debezium is built against, and a factory that starts the outbox connector on a
fresh outbox table. Without Java 17+ or Maven every test here skips with the reason."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass

import asyncpg
import pytest
import pytest_asyncio
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from consumerkit import migrate
from consumerkit.outbox import Outbox, OutboxRetention, OutboxTable
from consumerkit.outbox.retention import ensure_publication
from tests.harness import (
    DebeziumWorker,
    KafkaCluster,
    LogicalPostgres,
    start_debezium,
    start_kafka,
    start_logical_postgres,
)
from tests.harness.connect_jars import DEBEZIUM_KAFKA_VERSION, connect_lib
from tests.harness.kafka_jars import MissingToolError, require_tools
from tests.harness.pg_logical import debian_bin_dir

from ..brokers import KAFKA_VERSION, ON_KAFKA
from ..conftest import _USED


@pytest.fixture(scope="session")
def _connect_jars() -> None:
    try:
        require_tools(maven=False)  # Maven only for a first fetch: connect_lib says so then
        connect_lib()
    except MissingToolError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def cdc_kafka(_connect_jars: None, request: pytest.FixtureRequest) -> Iterator[KafkaCluster]:
    """The session's Apache Kafka when it runs Debezium's Kafka version, else one node of it:
    Connect must run the Kafka its connector is built against."""
    if ON_KAFKA and KAFKA_VERSION == DEBEZIUM_KAFKA_VERSION and not os.environ.get(
            "CONSUMERKIT_TEST_KAFKA_BOOTSTRAP"):
        yield request.getfixturevalue("_session_kafka")
        return
    with start_kafka(brokers=1, version=DEBEZIUM_KAFKA_VERSION) as cluster:
        request.config.stash[_USED]["kafka (for Debezium)"] = (
            f"Apache Kafka {cluster.version}, 1 node: {cluster.bootstrap}")
        yield cluster


@pytest.fixture(scope="session")
def cdc_postgres(_connect_jars: None, request: pytest.FixtureRequest
                 ) -> Iterator[LogicalPostgres]:
    """PostgreSQL with ``wal_level=logical``: the embedded wheel's (18), or Debian's when the
    session runs against a PostgreSQL of its own (CI's pass on PostgreSQL 15)."""
    debian = debian_bin_dir() if os.environ.get("CONSUMERKIT_TEST_POSTGRES_DSN") else None
    with start_logical_postgres(bindir=debian) as server:
        request.config.stash[_USED]["postgres (logical, for Debezium)"] = (
            f"wal_level=logical, binaries {server.bindir}: {server.dsn}")
        yield server


@dataclass
class Cdc:
    """One test's outbox table on the logical PostgreSQL, its topic and its connector."""

    postgres: LogicalPostgres
    kafka: KafkaCluster
    table: OutboxTable
    topic: str  # the aggregate type, which the EventRouter routes by
    worker: DebeziumWorker | None = None

    @property
    def outbox(self) -> Outbox:
        return Outbox(self.table.schema, self.table.table, notify=False,
                      retention=self.table.retention)

    def start(self, flush_interval_ms: int = 1000, slot: str | None = None) -> DebeziumWorker:
        """Start the connector on ``slot``: by default one it creates at its start."""
        self.worker = start_debezium(self.kafka.bootstrap, self.postgres, table=self.table,
                                     slot=slot or f"ck_{self.table.schema}",
                                     flush_interval_ms=flush_interval_ms)
        return self.worker


async def create_topic(bootstrap: str, name: str, partitions: int, replication: int = 1) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, replication_factor=replication)])
    finally:
        await admin.close()


async def new_cdc(postgres: LogicalPostgres, kafka: KafkaCluster, partitions: int,
                  replication: int = 1, retention: OutboxRetention | None = None) -> Cdc:
    """A migrated outbox in a fresh schema of ``postgres`` (kept in time partitions with a
    ``retention``) and its topic on ``kafka``."""
    suffix = uuid.uuid4().hex[:10]
    table = OutboxTable(f"cdc_{suffix}", "outbox", retention)
    conn = await asyncpg.connect(postgres.dsn)
    try:
        await migrate(conn, dedup=None, outboxes=[table])
        await ensure_publication(conn, table)  # the slot is the connector's, made at its start
    finally:
        await conn.close()
    topic = f"cdc.{suffix}"
    await create_topic(kafka.bootstrap, topic, partitions, replication)
    return Cdc(postgres, kafka, table, topic)


MakeCdc = Callable[..., Awaitable[Cdc]]


@pytest_asyncio.fixture(loop_scope="session")
async def make_cdc(cdc_postgres: LogicalPostgres, cdc_kafka: KafkaCluster
                   ) -> AsyncIterator[MakeCdc]:
    """``await make_cdc(partitions, retention=None)``: a migrated outbox in a fresh schema and
    its topic (the connector is started by ``cdc.start()``); stopped and its slot and
    publication dropped afterwards."""
    made: list[Cdc] = []

    async def make(partitions: int = 3, retention: OutboxRetention | None = None) -> Cdc:
        cdc = await new_cdc(cdc_postgres, cdc_kafka, partitions, retention=retention)
        made.append(cdc)
        return cdc

    yield make
    for cdc in made:
        if cdc.worker is not None:
            cdc.worker.stop()
        conn = await asyncpg.connect(cdc_postgres.dsn)
        try:
            await conn.execute(f'DROP PUBLICATION IF EXISTS "{cdc.table.publication}"')
        finally:
            await conn.close()
