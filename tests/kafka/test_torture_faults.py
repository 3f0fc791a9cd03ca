"""Two broker faults of the torture harness's ``kafka`` profile, each shown to bite on a real
Apache Kafka: a node started ``proxied`` is cut off from its clients while its proxy is held
(and serves again once released), and a partition's leadership moves to the node the admin
requests (AlterPartitionReassignments, then a preferred ElectLeaders). Skips without Java."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from tests.harness import KafkaCluster, MissingToolError, start_kafka

from ..torture.kafka_admin import move_leader

CUT = 3.0  # seconds a send must not complete while its node is cut off


async def test_a_proxied_node_is_cut_off_while_its_proxy_is_held() -> None:
    try:
        cluster = await asyncio.to_thread(start_kafka, 1, proxied=True)
    except MissingToolError as exc:
        pytest.skip(str(exc))
    with cluster:
        node = cluster.nodes[0]
        assert node.proxy is not None
        assert node.address == f"127.0.0.1:{node.proxy.port}" != f"127.0.0.1:{node.port}"
        topic = f"ck-cut-{uuid.uuid4().hex[:10]}"
        producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all",
                                    request_timeout_ms=60_000)
        await producer.start()
        try:
            admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap)
            await admin.start()
            try:
                await admin.create_topics([NewTopic(topic, 1, replication_factor=1)])
            finally:
                await admin.close()
            await cluster.leader(topic, 0)
            await asyncio.wait_for(producer.send_and_wait(topic, b"before"), 60)
            node.proxy.hold()
            pending = asyncio.ensure_future(producer.send_and_wait(topic, b"while cut"))
            done, _ = await asyncio.wait([pending], timeout=CUT)
            assert not done, "a send went through a node cut off by its proxy"
            assert node.proxy.held_bytes > 0
            node.proxy.release()
            metadata = await asyncio.wait_for(pending, 60)  # held, then delivered
            assert metadata.offset == 1
        finally:
            node.proxy.release()
            await producer.stop()


async def test_a_leadership_moves_where_the_admin_api_says(kafka_cluster: KafkaCluster) -> None:
    topic = f"ck-move-{uuid.uuid4().hex[:10]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_cluster.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, replication_factor=3)])
    finally:
        await admin.close()
    before = (await kafka_cluster.leader(topic, 0)).node_id
    to = next(n.node_id for n in kafka_cluster.nodes if n.node_id != before)
    deadline = time.monotonic() + 60
    while (error := await move_leader(kafka_cluster.bootstrap, topic, 0, to)) and (
            time.monotonic() < deadline):  # a new topic's replicas may not all be in sync yet
        await asyncio.sleep(0.5)
    assert error == ""
    while (now := (await kafka_cluster.leader(topic, 0)).node_id) != to:
        assert time.monotonic() < deadline, f"partition 0 still led by {now}, not {to}"
        await asyncio.sleep(0.2)
