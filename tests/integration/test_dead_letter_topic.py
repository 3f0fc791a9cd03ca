"""The dead-letter topic on a real broker: null header values, the detail header's cut, and a
record too large for the producer (stored reduced instead of retried forever)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import pytest

from consumerkit.deadletter import DeadLetterEntry, DeadLetterTopic
from consumerkit.deadletter.topic import DETAIL_HEADER, DETAIL_MAX_BYTES
from consumerkit.deadletter.writer import DeadLetterWriter
from consumerkit.testing.services import MakeTopic
from consumerkit.types import SinkResources

from ..brokers import PRODUCER_OPTIONS
from .ledger import read_topic

ENTRY = DeadLetterEntry(
    consumer="billing", topic="source", partition=0, offset=5, key=b"k", value=b'{"n": 1}',
    headers=[("id", b"e-5"), ("gone", None)], reason="handler_failed", detail="boom",
    attempts=3, event_id="e-5")


@pytest.fixture
async def open_sink(
    kafka_bootstrap: str, pg_pool: asyncpg.Pool,
) -> AsyncIterator[Callable[..., Awaitable[DeadLetterTopic]]]:
    opened: list[DeadLetterTopic] = []

    async def _open(topic: str, **producer_options: object) -> DeadLetterTopic:
        sink = DeadLetterTopic(topic, producer_options={**PRODUCER_OPTIONS,
                                                        **producer_options})
        await sink.open(SinkResources(pg_pool, "unused", kafka_bootstrap, {}, ("source",)))
        opened.append(sink)
        return sink

    yield _open
    for sink in opened:
        await sink.close()


async def test_null_header_values_and_a_detail_cut_between_characters(
    kafka_bootstrap: str, make_topic: MakeTopic,
    open_sink: Callable[..., Awaitable[DeadLetterTopic]],
) -> None:
    dlq = await make_topic(partitions=1)
    sink = await open_sink(dlq)
    # 3-byte characters: the 1334th crosses the 4000-byte limit (1999 of them are within the
    # detail's character limit, consumerkit.deadletter.entry.DETAIL_LIMIT)
    detail = "€" * 1999
    await sink.send(dataclasses.replace(ENTRY, detail=detail))
    [(value, headers)] = await read_topic(kafka_bootstrap, dlq, 1)
    assert value == b'{"n": 1}'
    assert headers[:2] == [("id", b"e-5"), ("gone", None)]
    cut = dict(headers)[DETAIL_HEADER]
    assert cut is not None
    assert cut.decode() == "€" * (DETAIL_MAX_BYTES // 3)


async def test_a_record_too_large_for_the_producer_is_published_without_its_value(
    kafka_bootstrap: str, make_topic: MakeTopic,
    open_sink: Callable[..., Awaitable[DeadLetterTopic]],
) -> None:
    """The producer refuses anything above ``max_request_size``: retrying the same record
    could never succeed, so the writer publishes it without value and headers at once."""
    dlq = await make_topic(partitions=1)
    sink = await open_sink(dlq, max_request_size=16_384)
    writer = DeadLetterWriter([sink])
    abandon = asyncio.Event()
    asyncio.get_running_loop().call_later(20, abandon.set)  # a retry loop fails, not hangs
    big = dataclasses.replace(ENTRY, value=b"v" * 40_000)
    assert await writer.write(big, abandon)
    assert not abandon.is_set()
    assert writer.failures == 0
    [(value, headers)] = await read_topic(kafka_bootstrap, dlq, 1)
    assert value is None
    names = [name for name, _ in headers]
    assert "id" not in names
    assert "gone" not in names
    detail = dict(headers)[DETAIL_HEADER]
    assert detail is not None
    assert detail.decode().startswith("boom [value and headers dropped: RecordTooLargeError")
