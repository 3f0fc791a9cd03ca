"""Kafka's admin requests that consumerkit makes: create a topic (demos and tests), and read
topics' configs and replication (the start-up horizon check, ``consumerkit check``)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError

from .kafka_access import describe_topics


async def create_topic(bootstrap: str, name: str, partitions: int,
                       options: Mapping[str, Any] | None = None,
                       replication_factor: int = 1) -> None:
    """Create ``name`` with ``partitions`` partitions (replication factor 1 unless given: for
    demos and tests; production topics are provisioned by their owners)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **dict(options or {}))
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, num_partitions=partitions,
                                            replication_factor=replication_factor)])
    finally:
        await admin.close()


async def describe_topic_configs(
    bootstrap: str, topics: Sequence[str], *, names: Sequence[str] | None = None,
    options: Mapping[str, Any] | None = None, timeout: float = 10.0,
) -> dict[str, dict[str, str]]:
    """The configs (``{name: value}``, only ``names`` if given) of each of ``topics`` that the
    broker describes. A topic it cannot describe (unknown, not allowed, a broker without
    DescribeConfigs, no answer within ``timeout`` seconds) is absent from the result: callers
    treat its configs as unknown. ``options`` are the Kafka options; those an admin client
    does not take are left out."""
    admin = admin_client(bootstrap, options, timeout)
    found: dict[str, dict[str, str]] = {}
    try:
        async with asyncio.timeout(timeout):
            await admin.start()
            # every config, filtered here: some brokers (Tansu) drop the connection when the
            # request names configs
            responses = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, topic) for topic in topics])
    except (KafkaError, OSError, TimeoutError):
        return found
    finally:
        await admin.close()
    for response in responses:
        for resource in response.to_object()["resources"]:
            if resource["error_code"] == 0 and resource["resource_name"] in topics:
                found[resource["resource_name"]] = {
                    entry["config_names"]: entry["config_value"]
                    for entry in resource["config_entries"]
                    if entry["config_value"] is not None
                    and (names is None or entry["config_names"] in names)}
    return found


async def describe_replication(
    bootstrap: str, topics: Sequence[str], *, options: Mapping[str, Any] | None = None,
    timeout: float = 10.0,
) -> dict[str, int]:
    """The replication factor of each of ``topics`` (the fewest replicas of any of its
    partitions) that the broker describes; the others are absent, as in
    :func:`describe_topic_configs`."""
    admin = admin_client(bootstrap, options, timeout)
    try:
        async with asyncio.timeout(timeout):
            await admin.start()
            described = await describe_topics(admin, topics)
    except (KafkaError, OSError, TimeoutError):
        return {}
    finally:
        await admin.close()
    return {t["topic"]: min(len(p["replicas"]) for p in t["partitions"])
            for t in described if t["error_code"] == 0 and t["partitions"]}


def admin_client(bootstrap: str, options: Mapping[str, Any] | None,
           timeout: float) -> AIOKafkaAdminClient:
    """An admin client with the Kafka options it takes (the others are left out)."""
    accepted = set(inspect.signature(AIOKafkaAdminClient).parameters)
    settings = {"request_timeout_ms": int(timeout * 1000),
                **{k: v for k, v in (options or {}).items() if k in accepted}}
    return AIOKafkaAdminClient(bootstrap_servers=bootstrap, **settings)
