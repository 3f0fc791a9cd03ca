"""Leaders moved with the admin API during a run: a partition's replicas put in a new order
(AlterPartitionReassignments, aiokafka's request), then a preferred-leader election
(ElectLeaders, API key 43, version 2, declared here with aiokafka 0.14's protocol classes:
aiokafka has no class or call for it). The same replica set in another order moves no data,
so the move takes effect at once; the election makes the new first replica the leader."""

from __future__ import annotations

from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.admin import AlterPartitionReassignmentsRequest
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    CompactArray,
    CompactString,
    Int8,
    Int16,
    Int32,
    Schema,
    TaggedFields,
)

PREFERRED = 0  # ElectLeaders' election type: the first replica, if it is in sync
TIMEOUT_MS = 10_000


class ElectLeadersResponse_v2(Response):  # type: ignore[misc]
    API_KEY = 43
    API_VERSION = 2
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        ("results", CompactArray(
            ("topic", CompactString("utf-8")),
            ("partitions", CompactArray(
                ("partition_id", Int32),
                ("error_code", Int16),
                ("error_message", CompactString("utf-8")),
                ("tags", TaggedFields),
            )),
            ("tags", TaggedFields),
        )),
        ("tags", TaggedFields),
    )


class ElectLeadersRequest_v2(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = 43
    API_VERSION = 2
    RESPONSE_TYPE = ElectLeadersResponse_v2
    SCHEMA = Schema(
        ("election_type", Int8),
        ("topic_partitions", CompactArray(
            ("topic", CompactString("utf-8")),
            ("partitions", CompactArray(Int32)),
            ("tags", TaggedFields),
        )),
        ("timeout_ms", Int32),
        ("tags", TaggedFields),
    )


class ElectLeadersRequest(Request[ElectLeadersRequest_v2]):  # type: ignore[misc]
    API_KEY = 43

    def __init__(self, topic: str, partition: int) -> None:
        self._topic = topic
        self._partition = partition

    def build(self, request_struct_class: type[ElectLeadersRequest_v2]) -> Any:
        return request_struct_class(PREFERRED, [(self._topic, [self._partition], {})],
                                    TIMEOUT_MS, {})


async def replicas(admin: AIOKafkaAdminClient, topic: str) -> dict[int, tuple[int, list[int],
                                                                              list[int]]]:
    """partition -> (leader, replicas in order, in-sync replicas)."""
    described = await admin.describe_topics([topic])
    return {p["partition"]: (int(p["leader"]), list(p["replicas"]), list(p["isr"]))
            for t in described if t["topic"] == topic for p in t["partitions"]}


async def move_leader(bootstrap: str, topic: str, partition: int, to: int) -> str:
    """Put node ``to`` first among ``partition``'s replicas, then elect the preferred leader.
    Returns "" once the election was accepted, else the errors the broker gave."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=TIMEOUT_MS)
    await admin.start()
    try:
        _, order, _ = (await replicas(admin, topic))[partition]
        order = [to, *(n for n in order if n != to)]
        moved = await admin._send_request(AlterPartitionReassignmentsRequest(  # no public call
            TIMEOUT_MS, [(topic, [(partition, order, {})], {})], {}))
        errors = [f"{e} {m}" for _, ps, _ in moved.responses for _, e, m, _ in ps if e]
        if moved.error_code or errors:
            return f"reassign: {moved.error_code} {moved.error_message} {errors}"
        elected = await admin._send_request(ElectLeadersRequest(topic, partition))
        # 84: ELECTION_NOT_NEEDED (already the leader), not an error for this fault
        failed = [f"{e} {m}" for _, ps, _ in elected.results for _, e, m, _ in ps
                  if e not in (0, 84)]
        if elected.error_code or failed:
            return f"elect: {elected.error_code} {failed}"
        return ""
    finally:
        await admin.close()
