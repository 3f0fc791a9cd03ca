"""Which producers wrote to a topic, as its partitions' leaders know them (DescribeProducers, API
key 61, KIP-664): an idempotent or transactional producer leaves its producer id in the state of
every partition it wrote to, a producer without idempotence none. So a topic whose partitions
list producer ids was written with idempotence on, from the broker's own answer.

aiokafka has no class for the request: :mod:`._describe_producers` declares it with aiokafka
0.14's protocol classes, loaded only when asked for (older aiokafka versions lack them), as
:mod:`tests.harness.kafka_lookup` loads DescribeQuorum. Each partition is asked of its
leader.
"""

from __future__ import annotations

from .kafka_lookup import _admin

__all__ = ["producer_ids"]


async def producer_ids(bootstrap: str, topic: str) -> dict[int, set[int]]:
    """The producer ids each partition of ``topic`` holds (by partition), from its leader.

    Raises RuntimeError when a leader answers with an error (a broker without the API says so
    too: DescribeProducers needs Kafka 2.8 or newer)."""
    from ._describe_producers import DescribeProducersRequest

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
