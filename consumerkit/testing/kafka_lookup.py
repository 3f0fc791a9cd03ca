"""Ask a running Kafka cluster who does what: the brokers it lists, a partition's leader, the
active controller and a consumer group's coordinator.

Metadata and FindCoordinator go through aiokafka's admin client. The active controller is not in
a KRaft cluster's metadata (brokers answer a random live broker there, since clients never talk
to controllers), so it comes from the DescribeQuorum API (key 55, KIP-595/836), which a broker
forwards to the quorum: its leader is the active controller. aiokafka has no class for that
request, so its version 0 is declared here with aiokafka's protocol types.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Int64,
    Schema,
    TaggedFields,
)

__all__ = [
    "METADATA_TOPIC",
    "active_controller",
    "group_coordinator",
    "in_thread",
    "listed_brokers",
    "partition_leader",
]

METADATA_TOPIC = "__cluster_metadata"
REQUEST_TIMEOUT_MS = 10_000
_T = TypeVar("_T")

_REPLICA = CompactArray(("replica_id", Int32), ("log_end_offset", Int64), ("tags", TaggedFields))


class DescribeQuorumResponse_v0(Response):  # type: ignore[misc]
    API_KEY = 55
    API_VERSION = 0
    SCHEMA = Schema(
        ("error_code", Int16),
        ("topics", CompactArray(
            ("topic_name", CompactString("utf-8")),
            ("partitions", CompactArray(
                ("partition_index", Int32),
                ("error_code", Int16),
                ("leader_id", Int32),
                ("leader_epoch", Int32),
                ("high_watermark", Int64),
                ("current_voters", _REPLICA),
                ("observers", _REPLICA),
                ("tags", TaggedFields),
            )),
            ("tags", TaggedFields),
        )),
        ("tags", TaggedFields),
    )


class DescribeQuorumRequest_v0(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = 55
    API_VERSION = 0
    RESPONSE_TYPE = DescribeQuorumResponse_v0
    SCHEMA = Schema(
        ("topics", CompactArray(
            ("topic_name", CompactString("utf-8")),
            ("partitions", CompactArray(("partition_index", Int32), ("tags", TaggedFields))),
            ("tags", TaggedFields),
        )),
        ("tags", TaggedFields),
    )


class DescribeQuorumRequest(Request[DescribeQuorumRequest_v0]):  # type: ignore[misc]
    API_KEY = 55

    def build(self, request_struct_class: type[DescribeQuorumRequest_v0]) -> Any:
        return request_struct_class([(METADATA_TOPIC, [(0, {})], {})], {})


@asynccontextmanager
async def _admin(bootstrap: str) -> AsyncIterator[Any]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap,
                                request_timeout_ms=REQUEST_TIMEOUT_MS)
    await asyncio.wait_for(admin.start(), REQUEST_TIMEOUT_MS / 1000)
    try:
        yield admin
    finally:
        await admin.close()


async def listed_brokers(bootstrap: str) -> set[int]:
    """The ids of the brokers the cluster's metadata lists (registered and unfenced)."""
    async with _admin(bootstrap) as admin:
        cluster = await admin.describe_cluster()
    return {int(broker["node_id"]) for broker in cluster["brokers"]}


async def partition_leader(bootstrap: str, topic: str, partition: int) -> int:
    """The node id leading ``topic``'s ``partition``; -1 while it has none (an election)."""
    async with _admin(bootstrap) as admin:
        topics = await admin.describe_topics([topic])
    for described in topics:
        if described["topic"] != topic or described["error_code"] != 0:
            continue
        for found in described["partitions"]:
            if found["partition"] == partition and found["error_code"] == 0:
                return int(found["leader"])
    return -1


async def active_controller(bootstrap: str) -> int:
    """The node id of the active controller (the metadata quorum's leader); -1 during an
    election."""
    async with _admin(bootstrap) as admin:
        response = await admin._send_request(DescribeQuorumRequest())  # no public call for it
    if response.error_code != 0:
        return -1
    for _name, partitions, _tags in response.topics:
        for entry in partitions:
            index, error_code, leader_id = entry[0], entry[1], entry[2]
            if index == 0 and error_code == 0:
                return int(leader_id)
    return -1


async def group_coordinator(bootstrap: str, group_id: str) -> int:
    """The node id of the broker coordinating consumer group ``group_id``."""
    async with _admin(bootstrap) as admin:
        return int(await admin.find_coordinator(group_id))


def in_thread(factory: Callable[[], Awaitable[_T]], timeout: float) -> _T:
    """Run a coroutine to completion from sync code, whether or not a loop is running here."""
    async def bounded() -> _T:
        return await asyncio.wait_for(factory(), timeout)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, bounded()).result(timeout + 5)
