"""Asking whether a topic is denied or how it is replicated must not create it: a broker with
``auto.create.topics.enable`` (Kafka's default, and Tansu) creates every missing topic that a
plain metadata request names, which would turn a relay's misrouted event into a topic nobody
reads."""

from __future__ import annotations

import uuid

from consumerkit.cli.check_broker import reach_broker
from consumerkit.transport.kafka_access import hidden_topics
from consumerkit.transport.kafka_admin import describe_replication


async def test_the_denied_and_replication_checks_create_no_topic(kafka_bootstrap: str) -> None:
    missing = [f"never-made-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    assert await hidden_topics(kafka_bootstrap, missing[:1], {}) == []
    assert await describe_replication(kafka_bootstrap, missing[1:]) == {}
    listed = await reach_broker(kafka_bootstrap, {})
    assert not set(missing) & listed, "a check created the topic it asked about"
