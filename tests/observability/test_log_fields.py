"""Log records about a message carry its fields (consumerkit.logs.MESSAGE_FIELDS): a retry and
a dead letter, as records and as JSON lines."""

from __future__ import annotations

import logging

import orjson
import pytest

from consumerkit import HandlerContext
from consumerkit.logs import MESSAGE_FIELDS, JsonFormatter

from ..integration.conftest import LedgerTopic
from ..integration.ledger import Running, Step, build, make_events, publish, settled
from ..integration.ledger import wait_for as wait


async def test_a_retry_and_a_dead_letter_carry_the_message_fields(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = await ledger_topic(partitions=1)
    flaky, poison = "evt-0-1", "evt-1-1"

    async def fail(event: Step, ctx: HandlerContext) -> None:
        ctx.log.info("handling %s", ctx.envelope.event_id)
        if ctx.envelope.event_id == flaky and ctx.attempt == 1:
            raise ConnectionAbortedError("flaky downstream")
        if ctx.envelope.event_id == poison:
            raise ValueError("never applicable")

    events = make_events(keys=2, per_key=1)
    await publish(kafka_bootstrap, topic, events)
    consumer = build("logs", pg_schema, topic, postgres_dsn, kafka_bootstrap, fail=fail)
    with caplog.at_level(logging.INFO, logger="consumerkit"):
        async with Running(consumer):
            await wait(lambda: settled(consumer, len(events)), 60, "every event settled")

    retry = _one(caplog, "retrying", flaky, attempt=1)
    dead = _one(caplog, "dead-lettered", poison, attempt=4)
    for record, event_id, key in ((retry, flaky, "key-0"), (dead, poison, "key-1")):
        fields = {name: getattr(record, name, None) for name in MESSAGE_FIELDS}
        assert fields["event_id"] == event_id
        assert fields["event_type"] == "step.recorded"
        assert fields["key"] == key
        assert fields["topic"] == topic
        assert fields["partition"] == 0
        assert isinstance(fields["offset"], int)
        assert str(fields["handler"]).endswith("record_step")
        assert fields["consumer"] == consumer.name
        line = orjson.loads(JsonFormatter().format(record))
        assert {name: line.get(name) for name in MESSAGE_FIELDS} == fields
        assert line["level"] == "WARNING"
    # the handler's own records (ctx.log) carry them too, the consumer's name aside
    handled = [r for r in caplog.records if r.getMessage() == f"handling {flaky}"]
    assert [getattr(r, "attempt", None) for r in handled] == [1, 2]
    assert {(getattr(r, "key", None), getattr(r, "offset", None)) for r in handled} == {
        ("key-0", retry.offset)}  # type: ignore[attr-defined]


def _one(caplog: pytest.LogCaptureFixture, words: str, event_id: str,
         attempt: int) -> logging.LogRecord:
    found = [r for r in caplog.records
             if words in r.getMessage() and getattr(r, "event_id", None) == event_id]
    assert len(found) == 1, [r.getMessage() for r in caplog.records]
    assert getattr(found[0], "attempt", None) == attempt
    return found[0]
