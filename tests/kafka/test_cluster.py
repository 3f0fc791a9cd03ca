"""The three-node Apache Kafka test cluster: its lookups name the node that leads a partition,
the quorum and a group; a node killed, stopped or paused leaves the metadata and comes back on
its kept log dir, and records written with ``acks=all`` survive the leader's death."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from consumerkit.testing.services import ServiceStartError, free_port
from tests.harness import KafkaCluster, KafkaNode, MissingToolError, kafka_lookup, start_kafka
from tests.harness.kafka_jars import require_tools

DEADLINE = 90.0  # a fenced broker leaves the metadata after its 9 s session, on busy cores


@asynccontextmanager
async def admin(cluster: KafkaCluster) -> AsyncIterator[Any]:
    client = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=10_000)
    await client.start()
    try:
        yield client
    finally:
        await client.close()


async def new_topic(cluster: KafkaCluster, partitions: int = 3) -> str:
    name = f"ck-cluster-{uuid.uuid4().hex[:10]}"
    async with admin(cluster) as client:
        await client.create_topics([NewTopic(name, partitions, replication_factor=3)])
    for partition in range(partitions):
        await cluster.leader(name, partition)
    return name


async def until_listed(cluster: KafkaCluster, node: KafkaNode, listed: bool) -> None:
    deadline = time.monotonic() + DEADLINE
    seen: set[int] = set()
    while time.monotonic() < deadline:
        try:
            seen = await kafka_lookup.listed_brokers(cluster._live_bootstrap())
        except Exception:  # a node in the bootstrap list is down; retried within the deadline
            seen = set()
        else:
            if (node.node_id in seen) == listed:
                return
        await asyncio.sleep(0.25)
    raise AssertionError(f"node {node.node_id} listed={not listed} after {DEADLINE}s: {seen}")


async def test_lookups_name_running_nodes(kafka_cluster: KafkaCluster) -> None:
    topic = await new_topic(kafka_cluster)
    ids = {node.node_id for node in kafka_cluster.nodes}
    assert ids == {1, 2, 3}
    assert await kafka_lookup.listed_brokers(kafka_cluster.bootstrap) == ids
    leaders = {(await kafka_cluster.leader(topic, p)).node_id for p in range(3)}
    assert leaders <= ids
    assert (await kafka_cluster.controller()).node_id in ids
    group = f"ck-group-{uuid.uuid4().hex[:8]}"
    coordinator = await kafka_cluster.coordinator(group)
    assert coordinator.node_id in ids
    # The answers are the cluster's, not guesses: asked again, a node gives the same ones.
    assert await kafka_lookup.group_coordinator(coordinator.address, group) == coordinator.node_id


async def test_a_killed_leader_is_replaced_and_restarts_on_its_log(
    kafka_cluster: KafkaCluster,
) -> None:
    topic = await new_topic(kafka_cluster, partitions=1)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_cluster.bootstrap, acks="all",
                                enable_idempotence=True, request_timeout_ms=10_000)
    await producer.start()
    try:
        for i in range(20):
            await producer.send_and_wait(topic, f"before-{i}".encode(), key=b"k")
        old = await kafka_cluster.leader(topic, 0)
        old.kill()
        assert not old.running()
        await until_listed(kafka_cluster, old, listed=False)
        new = await kafka_cluster.leader(topic, 0)
        assert new.node_id != old.node_id
        assert new.running()
        for i in range(20):  # two in-sync replicas remain: acks=all still succeeds
            await producer.send_and_wait(topic, f"after-{i}".encode(), key=b"k")
    finally:
        await producer.stop()
    assert (old.home / "data" / f"{topic}-0").is_dir()  # the log dir is kept...
    old.start()
    await until_listed(kafka_cluster, old, listed=True)  # ...and the node rejoins on it
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_cluster.bootstrap,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        values: list[bytes] = []
        deadline = time.monotonic() + DEADLINE
        while len(values) < 40 and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            values += [r.value for records in batch.values() for r in records]
    finally:
        await consumer.stop()
    assert values == [f"before-{i}".encode() for i in range(20)] + [
        f"after-{i}".encode() for i in range(20)]


async def test_a_paused_node_is_fenced_then_returns(kafka_cluster: KafkaCluster) -> None:
    node = kafka_cluster.node(2)
    node.pause()
    assert node.running()  # stopped, not dead
    await until_listed(kafka_cluster, node, listed=False)
    node.resume()
    await until_listed(kafka_cluster, node, listed=True)


async def test_a_stopped_controller_hands_the_quorum_over(kafka_cluster: KafkaCluster) -> None:
    controller = await kafka_cluster.controller()
    await asyncio.to_thread(controller.stop)
    assert not controller.running()
    successor = await kafka_cluster.controller()
    assert successor.node_id != controller.node_id
    controller.start()
    await until_listed(kafka_cluster, controller, listed=True)


def test_a_node_that_dies_at_start_raises_with_its_log() -> None:
    try:
        require_tools()
    except MissingToolError as exc:
        pytest.skip(str(exc))
    with pytest.raises(ServiceStartError) as caught:
        start_kafka(brokers=1, jvm_options=("-XX:+NoSuchOptionForThisTest",), timeout=120)
    message = str(caught.value)
    assert "Kafka node 1" in message
    assert "died while the cluster started" in message
    assert "NoSuchOptionForThisTest" in message  # the JVM's own words, from the node's log


def test_a_port_taken_before_the_node_binds_it_is_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    try:
        require_tools()
    except MissingToolError as exc:
        pytest.skip(str(exc))
    from tests.harness import kafka

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = int(taken.getsockname()[1])
        handed: list[int] = []

        def first_taken() -> int:  # the first client port handed out is one in use
            port = busy if not handed else free_port()
            handed.append(port)
            return port

        monkeypatch.setattr(kafka, "free_port", first_taken)
        with start_kafka(brokers=1) as cluster:
            assert cluster.nodes[0].port != busy
    assert handed[0] == busy
    assert len(handed) == 4  # two ports, twice
