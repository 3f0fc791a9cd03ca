"""DescribeProducers (API key 61, version 0, KIP-664), declared with aiokafka 0.14's protocol
classes: aiokafka has no class for it. A partition's leader answers with the producer ids it
holds for that partition."""

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
