"""The broker failures of the ``kafka`` profile, on a three-node Apache Kafka cluster
(:func:`tests.harness.kafka.start_kafka`, replication factor 3, ``min.insync.replicas=2``,
unclean leader election off), started with a fault proxy in front of every node's advertised
listener. They add to the faults of :mod:`tests.torture.faults`; each returns True once it
happened, and every wait is bounded.

A node killed or stopped is started again on the same ports and log dir, and the fault ends
once the cluster's metadata lists every broker again.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter
from collections.abc import Callable

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from tests.harness.kafka import (
    DEFAULT_KAFKA_VERSION,
    KafkaCluster,
    KafkaNode,
    start_kafka,
)

from .consumer_proc import GROUP
from .faults import Fault, Rig
from .kafka_admin import move_leader, replicas

log = logging.getLogger("torture")

DOWN = 2.0  # seconds a killed node stays down before it is started again
READY_TIMEOUT = 150.0  # a JVM starting on two busy cores
# past a broker's session with the controller (broker.session.timeout.ms, 9 s by default)
# and the consumers' session (3 s): the node is fenced, its partitions move, then it wakes
BROKER_SESSION = 9.0
CUT = 8.0  # seconds a node is cut off by its proxy (under replica.lag.time.max.ms, 10 s)
MOVE_TIMEOUT = 30.0
# negative controls of this profile, set in the consumers' environment (consumer_proc.py):
# read_uncommitted reads aborted transactions' records, which the checker must catch
KAFKA_MUTANTS = ("read_uncommitted",)


def start_cluster() -> KafkaCluster:
    """Three nodes, each advertised through a fault proxy of this process; the release
    ``$CONSUMERKIT_TEST_KAFKA_VERSION`` names, as for the tests, or the default one."""
    version = os.environ.get("CONSUMERKIT_TEST_KAFKA_VERSION") or DEFAULT_KAFKA_VERSION
    return start_kafka(brokers=3, version=version, proxied=True)


async def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """The torture topic, replicated on every node; ready once every partition has a leader
    with all three replicas in sync."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, replication_factor=3)])
        for _ in range(300):
            found = await replicas(admin, topic)
            if len(found) == partitions and all(
                    leader >= 0 and len(isr) == 3 for leader, _, isr in found.values()):
                return
            await asyncio.sleep(0.1)
        raise TimeoutError(f"topic {topic} not ready: {found}")
    finally:
        await admin.close()


def _cluster(rig: Rig) -> KafkaCluster:
    assert isinstance(rig.broker, KafkaCluster), "a Kafka fault needs the kafka profile"
    return rig.broker


async def _leaders(rig: Rig) -> dict[int, tuple[int, list[int], list[int]]]:
    cluster = _cluster(rig)
    live = ",".join(n.address for n in cluster.nodes if n.running())
    admin = AIOKafkaAdminClient(bootstrap_servers=live, request_timeout_ms=10_000)
    await admin.start()
    try:
        return await replicas(admin, rig.topic)
    finally:
        await admin.close()


async def _down_and_up(rig: Rig, node: KafkaNode, down: Callable[[], None]) -> bool:
    log.info("kafka node %d goes down", node.node_id)
    await asyncio.to_thread(down)
    await asyncio.sleep(DOWN)  # the cluster goes on without it
    node.start()
    await asyncio.to_thread(_cluster(rig).wait_ready, READY_TIMEOUT)
    return True


async def broker_leader_kill(rig: Rig) -> bool:
    """SIGKILL of the node leading the most partitions of the topic (its busiest node)."""
    counts = Counter(leader for leader, _, _ in (await _leaders(rig)).values() if leader >= 0)
    if not counts:
        return False
    node = _cluster(rig).node(counts.most_common(1)[0][0])
    return await _down_and_up(rig, node, node.kill)


async def broker_restart(rig: Rig) -> bool:
    """A controlled restart (SIGTERM: leaders moved away first), then start."""
    nodes = _cluster(rig).nodes
    node = nodes[rig.rng.randrange(len(nodes))]
    return await _down_and_up(rig, node, node.stop)


async def controller_kill(rig: Rig) -> bool:
    """SIGKILL of the active controller (the KRaft quorum's leader)."""
    node = await _cluster(rig).controller()
    return await _down_and_up(rig, node, node.kill)


async def coordinator_kill(rig: Rig) -> bool:
    """SIGKILL of the node coordinating the consumers' group."""
    node = await _cluster(rig).coordinator(GROUP)
    return await _down_and_up(rig, node, node.kill)


async def broker_zombie(rig: Rig) -> bool:
    """SIGSTOP past the broker's session, then SIGCONT: fenced, then it comes back."""
    nodes = _cluster(rig).nodes
    node = nodes[rig.rng.randrange(len(nodes))]
    node.pause()
    try:
        await asyncio.sleep(BROKER_SESSION * 1.2)  # the length of the freeze is the fault
    finally:
        node.resume()
    await asyncio.to_thread(_cluster(rig).wait_ready, READY_TIMEOUT)
    return True


async def broker_cut(rig: Rig) -> bool:
    """A node cut off by its proxy: no client and no other broker reaches it (the quorum
    still does, so it stays registered and keeps its leaderships, which stall)."""
    nodes = [n for n in _cluster(rig).nodes if n.proxy is not None]
    if not nodes:
        return False
    node = nodes[rig.rng.randrange(len(nodes))]
    proxy = node.proxy
    assert proxy is not None
    before = proxy.held_bytes
    proxy.hold()
    try:
        await asyncio.sleep(CUT)
    finally:
        proxy.release()
    log.info("kafka node %d was cut off for %gs: %d bytes held back", node.node_id, CUT,
             proxy.held_bytes - before)
    return True


async def leader_move(rig: Rig) -> bool:
    """A partition's leadership moved to another in-sync replica with the admin API."""
    found = await _leaders(rig)
    partition = rig.rng.randrange(len(found))
    leader, _, isr = found[partition]
    targets = [n for n in isr if n != leader and _cluster(rig).node(n).running()]
    if not targets:
        return False
    to = targets[rig.rng.randrange(len(targets))]
    live = ",".join(n.address for n in _cluster(rig).nodes if n.running())
    error = await move_leader(live, rig.topic, partition, to)
    if error:
        log.warning("leader_move of partition %d to node %d: %s", partition, to, error)
        return False
    for _ in range(int(MOVE_TIMEOUT / 0.2)):
        if (await _leaders(rig))[partition][0] == to:
            return True
        await asyncio.sleep(0.2)
    log.warning("leader_move: partition %d is not led by node %d after %gs", partition, to,
                MOVE_TIMEOUT)
    return False


KAFKA_KINDS: dict[str, Fault] = {
    "broker_leader_kill": broker_leader_kill,
    "broker_restart": broker_restart,
    "broker_zombie": broker_zombie,
    "controller_kill": controller_kill,
    "coordinator_kill": coordinator_kill,
    "broker_cut": broker_cut,
    "leader_move": leader_move,
}
