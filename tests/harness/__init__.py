"""The project's own test harnesses: servers the suite, the benchmarks and the torture test start,
which a team's tests of their handlers do not need, so they stay out of the wheel.

- :func:`start_kafka` (:mod:`.kafka`): Apache Kafka, KRaft, one or three nodes, from Maven
  Central's jars (Java 17+ and Maven), optionally with TLS, SASL and ACLs (:mod:`.kafka_security`).
- :func:`start_logical_postgres` (:mod:`.pg_logical`): PostgreSQL with ``wal_level=logical``
  on a TCP port, for change data capture.
- :func:`start_debezium` (:mod:`.debezium`): a Kafka Connect worker with Debezium's outbox
  connector.
- :func:`start_replicated_postgres` (:mod:`.replication`): a primary with a streaming standby.
- :func:`~.pgbouncer.start_pgbouncer` (:mod:`.pgbouncer`): PgBouncer in front of a PostgreSQL,
  for tests/pooler, the pooler benchmark and ``scripts/test-pooler.sh``.

What a team's tests need (``TestConsumer``, the pytest plugin, Tansu, PostgreSQL and Redis)
is in :mod:`consumerkit.testing`.
"""

from .debezium import DebeziumWorker, start_debezium
from .kafka import KafkaCluster, KafkaNode, start_kafka
from .kafka_jars import MissingToolError
from .pg_logical import LogicalPostgres, start_logical_postgres
from .replication import ReplicatedPostgres, start_replicated_postgres

__all__ = [
    "DebeziumWorker",
    "KafkaCluster",
    "KafkaNode",
    "LogicalPostgres",
    "MissingToolError",
    "ReplicatedPostgres",
    "start_debezium",
    "start_kafka",
    "start_logical_postgres",
    "start_replicated_postgres",
]
