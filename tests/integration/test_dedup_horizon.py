"""The redelivery-horizon check: pure comparisons, then topic retention read from the broker
(an unreadable one is "unknown", never an error)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from consumerkit import RetryPolicy
from consumerkit.dedup import DedupPolicy
from consumerkit.dedup.horizon import (
    FOREVER,
    Finding,
    horizon_findings,
    redelivery_horizon_check,
    retry_horizon,
)
from consumerkit.testing.services import free_port
from consumerkit.transport.kafka_admin import describe_topic_configs

from ..conftest import wait_for_partitions

DAY = timedelta(days=1)
WEEK = DedupPolicy()  # 7 days, expired="dead_letter"


def levels(findings: list[Finding]) -> list[str]:
    return [f.level for f in findings]


def test_the_retry_horizon_adds_every_wait_and_attempt() -> None:
    retry = RetryPolicy(max_attempts=4, initial_delay=1, max_delay=3, multiplier=2)
    assert retry_horizon(retry) == timedelta(seconds=1 + 2 + 3)
    assert retry_horizon(retry, handler_timeout=10) == timedelta(seconds=6 + 40)
    assert retry_horizon(RetryPolicy(max_attempts=1)) == timedelta(0)


def test_a_window_shorter_than_the_retries_is_an_error() -> None:
    short = DedupPolicy(retention=timedelta(hours=1), partition_interval=timedelta(hours=1))
    slow = RetryPolicy(max_attempts=10, initial_delay=60, max_delay=600)
    [finding] = horizon_findings(short, retry=slow, topic_retention={})
    assert finding.level == "error"
    assert "1h" in finding.message
    assert horizon_findings(WEEK, retry=slow, topic_retention={}) == []


def test_topic_retention_and_parked_replays() -> None:
    findings = horizon_findings(
        WEEK, retry=RetryPolicy(), parked_for=10 * DAY,
        topic_retention={"orders": 3 * DAY, "audit": FOREVER, "legacy": 30 * DAY,
                         "mystery": None})
    assert levels(findings) == ["warning", "warning", "warning", "unknown"]
    parked, audit, legacy, mystery = (f.message for f in findings)
    assert "dead letters may wait 10d" in parked
    assert "topic audit keeps records forever" in audit
    assert "topic legacy keeps records for 30d" in legacy
    assert "dead-lettered as expired" in legacy
    assert "topic mystery" in mystery
    applying = DedupPolicy(expired="apply")
    [again] = horizon_findings(applying, retry=RetryPolicy(), topic_retention={"t": FOREVER})
    assert "applied a second time" in again.message


@pytest.fixture
async def topics(kafka_bootstrap: str) -> AsyncIterator[dict[str, str]]:
    """Topics with a retention of 1 hour, 30 days and forever."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap, request_timeout_ms=10_000)
    await admin.start()
    names = {label: f"ck-h-{label}-{uuid.uuid4().hex[:8]}" for label in ("hour", "month", "ever")}
    retention = {"hour": 3_600_000, "month": 30 * 86_400_000, "ever": -1}
    await admin.create_topics([
        NewTopic(name, 1, 1, topic_configs={"retention.ms": str(retention[label])})
        for label, name in names.items()])
    for name in names.values():  # known to every broker before one is asked for its configs
        await wait_for_partitions(admin, name, 1)
    try:
        yield names
    finally:
        await admin.delete_topics(list(names.values()))
        await admin.close()


async def test_topic_retention_is_read_from_the_broker(
    kafka_bootstrap: str, topics: dict[str, str],
) -> None:
    configs = await describe_topic_configs(kafka_bootstrap, list(topics.values()),
                                           names=["retention.ms"])
    assert configs[topics["hour"]] == {"retention.ms": "3600000"}
    findings = await redelivery_horizon_check(
        WEEK, topics=[topics["hour"], topics["month"], topics["ever"]],
        kafka_bootstrap=kafka_bootstrap)
    assert levels(findings) == ["warning", "warning"]
    assert {topics["month"], topics["ever"]} == {
        t for f in findings for t in topics.values() if t in f.message}


async def test_an_unreachable_broker_gives_unknown_without_failing() -> None:
    started = time.monotonic()
    findings = await redelivery_horizon_check(
        WEEK, topics=["orders"], kafka_bootstrap=f"127.0.0.1:{free_port()}", timeout=2)
    assert levels(findings) == ["unknown"]
    assert time.monotonic() - started < 10
