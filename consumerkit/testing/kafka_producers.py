"""Which producers wrote to a topic, as its partitions' leaders know them (DescribeProducers, API
key 61, KIP-664): an idempotent or transactional producer leaves its producer id in the state of
every partition it wrote to, a producer without idempotence none. So a topic whose partitions
list producer ids was written with idempotence on, from the broker's own answer.

aiokafka has no class for the request; its version 0 is declared here with aiokafka's protocol
types, as :mod:`consumerkit.testing.kafka_lookup` declares DescribeQuorum. Each partition is
asked of its leader.
"""

from __future__ import annotations

from typing import Any

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

from .kafka_lookup import _admin

__all__ = ["producer_ids"]


class DescribeProducersResponse_v0(Response):  # type: ignore[misc]
    API_KEY = 61
    API_VERSION = 0
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("topics", CompactArray(
            ("name", CompactString("utf-8")),
            ("partitions", CompactArray(
                ("partition_index", Int32),
                ("error_code", Int16),
                ("error_message", CompactString("utf-8")),
                ("active_producers", CompactArray(
                    ("producer_id", Int64),
                    ("producer_epoch", Int32),
                    ("last_sequence", Int32),
                    ("last_timestamp", Int64),
                    ("coordinator_epoch", Int32),
                    ("current_txn_start_offset", Int64),
                    ("tags", TaggedFields),
                )),
                ("tags", TaggedFields),
            )),
            ("tags", TaggedFields),
        )),
        ("tags", TaggedFields),
    )


class DescribeProducersRequest_v0(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = 61
    API_VERSION = 0
    RESPONSE_TYPE = DescribeProducersResponse_v0
    SCHEMA = Schema(
        ("topics", CompactArray(
            ("name", CompactString("utf-8")),
            ("partition_indexes", CompactArray(Int32)),
            ("tags", TaggedFields),
        )),
        ("tags", TaggedFields),
    )


class DescribeProducersRequest(Request[DescribeProducersRequest_v0]):  # type: ignore[misc]
    API_KEY = 61

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition

    def build(self, request_struct_class: type[DescribeProducersRequest_v0]) -> Any:
        return request_struct_class([(self.topic, [self.partition], {})], {})


async def producer_ids(bootstrap: str, topic: str) -> dict[int, set[int]]:
    """The producer ids each partition of ``topic`` holds (by partition), from its leader.

    Raises RuntimeError when a leader answers with an error (a broker without the API says so
    too: DescribeProducers needs Kafka 2.8 or newer)."""
    found: dict[int, set[int]] = {}
    async with _admin(bootstrap) as admin:
        (described,) = await admin.describe_topics([topic])
        for partition in described["partitions"]:
            index, leader = int(partition["partition"]), int(partition["leader"])
            response = await admin._send_request_to_node(  # no public call for it
                leader, DescribeProducersRequest(topic, index))
            for _name, partitions, _tags in response.topics:
                for entry in partitions:
                    error_code, message, producers = entry[1], entry[2], entry[3]
                    if error_code != 0:
                        raise RuntimeError(f"DescribeProducers on {topic}-{index} (leader "
                                           f"{leader}): error {error_code} {message or ''}")
                    found[index] = {int(p[0]) for p in producers}
    return found
