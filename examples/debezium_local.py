"""Debezium's outbox connector for real in a test, without Docker (Java 17 and Maven needed):
a Kafka Connect worker killed, started again and stopped around the writes of a test."""

from __future__ import annotations

from consumerkit.outbox import OutboxTable
from tests.harness import KafkaCluster, LogicalPostgres, start_debezium


def with_a_connector(kafka: KafkaCluster, postgres: LogicalPostgres, table: OutboxTable) -> None:
    """``postgres`` from ``start_logical_postgres()`` (``wal_level=logical`` on a TCP port),
    ``kafka`` from ``start_kafka(brokers=1, version=DEBEZIUM_KAFKA_VERSION)``, and ``table``
    migrated there with its publication and slot (``consumerkit migrate --outbox-cdc``)."""
    worker = start_debezium(kafka.bootstrap, postgres, table=table,
                            slot=table.replication_slot)
    worker.kill()  # SIGKILL: Debezium re-sends from its last flushed position on start()
    worker.start()  # waits until the connector and its task are RUNNING, the slot active
    worker.stop()  # and drops the replication slot
