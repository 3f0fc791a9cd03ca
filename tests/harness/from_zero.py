"""Readers of test topics from offset 0.

A test topic is fresh and never truncated, so its log begins at offset 0. The beginning a
broker names can be later: Tansu 0.6 names the batch it stored first in time, and two
producers' first appends to a fresh partition, sent at once, are now and then stored out of
order (``python -m tests.torture.broker_earliest``). A reader from "earliest" (or
``seek_to_beginning``) then never reads the first batch, though the log holds it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

__all__ = ["assign_from_zero", "rewind"]


async def assign_from_zero(reader: AIOKafkaConsumer, topics: Sequence[str],
                           timeout: float = 30.0) -> list[TopicPartition]:
    """Assign ``reader`` (started, without a group) every partition of ``topics`` once the
    metadata lists them all, each at offset 0; returns the partitions. TimeoutError after
    ``timeout`` s without them."""
    async with asyncio.timeout(timeout):
        while True:
            try:  # no public call returns a fresh read of the partitions
                cluster = await reader._client.fetch_all_metadata()
            except KafkaError:  # no broker answered (one restarting): ask again
                cluster = None
            listed = {t: cluster.partitions_for_topic(t) if cluster else None for t in topics}
            if all(listed.values()):
                break
            await asyncio.sleep(0.1)
    parts = [TopicPartition(t, p) for t, ps in listed.items() for p in sorted(ps or ())]
    reader.assign(parts)
    rewind(reader, parts)
    return parts


def rewind(reader: AIOKafkaConsumer, parts: Sequence[TopicPartition]) -> None:
    """Move ``reader`` back to offset 0 of each of ``parts``."""
    for tp in parts:
        reader.seek(tp, 0)
