"""The demo's broker: the one given with ``--kafka``, an embedded Tansu (the default), or, with
``--broker kafka``, a three-broker Apache Kafka cluster of which the run SIGKILLs one broker.

On Kafka the topics get three replicas (``min.insync.replicas=2``, unclean leader election off,
as the repository's test harness configures the cluster) and the relays run
with the idempotent producer on, their default; Tansu has no idempotent producer. The broker
killed is the one leading the most partitions of the orders topic, which carries most of the
run's events; it is started again at once on its own log dir, and the run's table says
whether it was listed in the cluster's metadata again within :data:`REJOIN_TIMEOUT`, and
whether the brokers hold the relays' producer ids on both topics (idempotence was on).

That cluster is the project's own test harness (``tests/harness``, Java and Maven), which the
wheel does not ship: ``--broker kafka`` runs from a clone of the repository, and says so in one
line anywhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..testing.services import ServiceStartError

if TYPE_CHECKING:
    from tests.harness.kafka import KafkaCluster

KAFKA_BROKERS = 3
REJOIN_TIMEOUT = 180.0  # a JVM restarting on two busy cores


@dataclass(frozen=True, slots=True)
class Broker:
    bootstrap: str
    description: str
    replication_factor: int = 1
    idempotence: bool = False  # the relays' producer
    pids: tuple[int, ...] = ()  # of the servers started here


@dataclass(frozen=True, slots=True)
class BrokerKill:
    node_id: int
    pid: int
    led: int  # partitions of the topic it led
    partitions: int
    restarted_pid: int


class BrokerFaults(Protocol):
    """What the scenario may do to the brokers of the run."""

    async def kill_busiest(self, topic: str, partitions: int) -> BrokerKill:
        """SIGKILL the broker leading the most of ``topic``'s partitions; start it again."""

    async def rejoined(self, node_id: int) -> str | None:
        """None once ``node_id`` is listed in the metadata again, else why not (bounded)."""

    async def producers(self, topic: str) -> set[int]:
        """The ids of the idempotent producers that wrote to ``topic``, as its leaders hold
        them (none for a producer without idempotence)."""


class ClusterFaults:
    """:class:`BrokerFaults` on a :class:`~tests.harness.kafka.KafkaCluster`."""

    def __init__(self, cluster: KafkaCluster) -> None:
        self.cluster = cluster

    async def kill_busiest(self, topic: str, partitions: int) -> BrokerKill:
        leaders = [(await self.cluster.leader(topic, p)).node_id for p in range(partitions)]
        counts = Counter(leaders)
        # the lowest id among those leading the most: the same choice for the same layout
        node = self.cluster.node(min(counts, key=lambda n: (-counts[n], n)))
        pid = node.pid
        assert pid is not None
        await asyncio.to_thread(node.kill)
        node.start()
        assert node.pid is not None
        return BrokerKill(node.node_id, pid, counts[node.node_id], partitions, node.pid)

    async def rejoined(self, node_id: int) -> str | None:
        if not self.cluster.node(node_id).running():
            return f"broker {node_id} is not running"
        # every running node listed, the restarted one included (it dies: an error at once)
        try:
            from tests.harness import kafka_lookup

            await asyncio.to_thread(self.cluster.wait_ready, REJOIN_TIMEOUT)
            listed = await kafka_lookup.listed_brokers(self.cluster.bootstrap)
        except Exception as exc:  # a node that died, a timeout: the reason, in one line
            return (str(exc).splitlines() or [type(exc).__name__])[0]
        return None if node_id in listed else f"broker {node_id} is not in the metadata"

    async def producers(self, topic: str) -> set[int]:
        from tests.harness.kafka_producers import producer_ids

        by_partition = await producer_ids(self.cluster.bootstrap, topic)
        return set().union(*by_partition.values())


@contextlib.asynccontextmanager
async def broker(kind: str, bootstrap: str | None,
                 ) -> AsyncIterator[tuple[Broker, BrokerFaults | None]]:
    """The broker of the run, and what may be done to it; servers started here are stopped on
    the way out. Without Java or Maven, ``kind="kafka"`` raises MissingToolError (one line)."""
    if bootstrap is not None:
        yield Broker(bootstrap, f"the broker at {bootstrap}"), None
        return
    if kind == "kafka":
        try:
            from tests.harness.kafka import start_kafka
        except ImportError:
            raise ServiceStartError(
                "consumerkit demo --broker kafka runs from a clone of the consumerkit repository "
                "(its test harness starts the cluster); without one, leave out --broker") from None

        starting = asyncio.ensure_future(asyncio.to_thread(start_kafka, KAFKA_BROKERS))
        try:
            cluster = await asyncio.shield(starting)
        except asyncio.CancelledError:  # Ctrl-C: the start (bounded) ends in its thread,
            with contextlib.suppress(Exception):  # then what it started is stopped
                await asyncio.to_thread((await starting).stop)
            raise
        try:
            pids = tuple(n.pid for n in cluster.nodes if n.pid is not None)
            yield Broker(cluster.bootstrap,
                         f"Apache Kafka {cluster.version}, {len(cluster.nodes)} brokers "
                         f"(KRaft), replication factor {KAFKA_BROKERS}, "
                         "min.insync.replicas=2, idempotent relays",
                         KAFKA_BROKERS, True, pids), ClusterFaults(cluster)
        finally:
            await asyncio.to_thread(cluster.stop)
        return
    from ..testing.services import start_tansu

    with start_tansu() as tansu:
        yield Broker(tansu.bootstrap, "Tansu (embedded, memory storage)",
                     pids=(tansu.pid,)), None
