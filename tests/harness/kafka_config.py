"""The configuration of an Apache Kafka test node: its server.properties, its logging and its
JVM options, and the cluster id its log dir is formatted with. Pure functions, no JVM needed."""

from __future__ import annotations

import base64
import uuid
from pathlib import Path

__all__ = ["JVM_OPTIONS", "LOG4J1", "LOG4J2", "log_option", "new_cluster_id", "node_properties",
           "render_properties"]

# Small heaps and one GC thread: up to three nodes share two cores with the tests.
JVM_OPTIONS = ("-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
               "-Djava.awt.headless=true")
LOG4J2 = """status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
logger.clients.name = org.apache.kafka.clients
logger.clients.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
"""
LOG4J1 = """log4j.rootLogger=INFO, out
log4j.appender.out=org.apache.log4j.ConsoleAppender
log4j.appender.out.layout=org.apache.log4j.PatternLayout
log4j.appender.out.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.org.apache.kafka.clients=WARN
log4j.logger.state.change.logger=WARN
"""


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, url-safe base64 without padding (22 characters),
    never starting with ``-``: StorageTool would read it as an option (Kafka's own Uuid
    draws again for the same reason)."""
    while True:
        found = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not found.startswith("-"):
            return found


def node_properties(
    node_id: int, ports: dict[int, tuple[int, int]], log_dir: Path,
    advertised_port: int | None = None,
) -> dict[str, str]:
    """The server.properties of node ``node_id`` in a cluster whose nodes listen on ``ports``
    (node id -> (client port, controller port)); replication follows the cluster's size.
    ``advertised_port``: the port clients and the other brokers are told to connect to (a
    proxy in front of the node's own), the node's own port if None."""
    port, controller = ports[node_id]
    size = len(ports)
    factor, min_isr = (3, 2) if size >= 3 else (size, 1)
    voters = ",".join(f"{n}@127.0.0.1:{c}" for n, (_, c) in sorted(ports.items()))
    return {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{advertised_port or port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(log_dir),
        "default.replication.factor": str(factor),
        "min.insync.replicas": str(min_isr),
        "unclean.leader.election.enable": "false",
        "offsets.topic.replication.factor": str(factor),
        "offsets.topic.num.partitions": "5",
        "transaction.state.log.replication.factor": str(factor),
        "transaction.state.log.min.isr": str(min_isr),
        "transaction.state.log.num.partitions": "5",
        "share.coordinator.state.topic.replication.factor": str(factor),
        "share.coordinator.state.topic.min.isr": str(min_isr),
        "group.initial.rebalance.delay.ms": "0",
        # Tests run consumers with sessions of a few seconds, under the 6 s default minimum.
        "group.min.session.timeout.ms": "1000",
        # Tests send record timestamps days ahead (a duplicate across the dedup table's day
        # partitions); 4.x refuses more than an hour ahead by default, 3.x accepts any.
        "log.message.timestamp.after.max.ms": str(30 * 24 * 3600 * 1000),
        # Its 128 MiB default is heap; tests never compact that much.
        "log.cleaner.dedupe.buffer.size": "2097152",
        "log.cleaner.threads": "1",
        "num.network.threads": "2",
        "num.io.threads": "2",
        "background.threads": "2",
        "num.replica.fetchers": "1",
        "num.recovery.threads.per.data.dir": "1",
        # A paused follower leaves the ISR after 10 s, not 30 s.
        "replica.lag.time.max.ms": "10000",
    }


def render_properties(properties: dict[str, str]) -> str:
    return "".join(f"{key}={value}\n" for key, value in properties.items())


def log_option(version: str, directory: Path) -> str:
    """Write the logging configuration of Kafka ``version`` into ``directory``; return the JVM
    option that points to it (log4j2 from 4.0 on, reload4j before)."""
    if int(version.split(".", 1)[0]) >= 4:
        (directory / "log4j2.properties").write_text(LOG4J2)
        return f"-Dlog4j2.configurationFile={directory / 'log4j2.properties'}"
    (directory / "log4j.properties").write_text(LOG4J1)
    return f"-Dlog4j.configuration=file:{directory / 'log4j.properties'}"
