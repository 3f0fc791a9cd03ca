"""DescribeQuorum (API key 55, version 0), declared with aiokafka 0.14's protocol classes:
aiokafka has no class for it. A broker forwards it to the KRaft quorum, whose leader is the
active controller."""

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

METADATA_TOPIC = "__cluster_metadata"

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
