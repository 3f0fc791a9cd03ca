"""Ask a running Kafka cluster who does what: the brokers it lists, a partition's leader, the
active controller and a consumer group's coordinator.

Metadata and FindCoordinator go through aiokafka's admin client. The active controller is not in
a KRaft cluster's metadata (brokers answer a random live broker there, since clients never talk
to controllers), so it comes from the DescribeQuorum API (key 55, KIP-595/836), which a broker
forwards to the quorum: its leader is the active controller. aiokafka has no class for that
request, so its version 0 is declared in ``_describe_quorum`` with aiokafka's protocol types
(aiokafka 0.14 or newer for that lookup).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from aiokafka.admin import AIOKafkaAdminClient

__all__ = [
    "active_controller",
    "group_coordinator",
    "in_thread",
    "listed_brokers",
    "partition_leader",
]

REQUEST_TIMEOUT_MS = 10_000
_T = TypeVar("_T")


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
    # Imported here: the request is declared the aiokafka 0.14 way, and consumerkit.testing
    # must import under the older aiokafka versions consumerkit supports.
    from ._describe_quorum import DescribeQuorumRequest

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
