"""``consumerkit_duplicate_age_seconds`` observes every duplicate the store recognises, those
of one fetch too: copies of an event in the same batch (the original applied in that very
transaction) as well as copies that find it committed, for per-record and batch handlers."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from consumerkit import BatchContext, HandlerContext, Limits, handler

from ..integration.conftest import LedgerTopic
from ..integration.ledger import Event, Running, Step, build, publish, settled
from ..integration.ledger import wait_for as wait

DISTINCT = 4
COPIES = 3  # each event three times in a row: two duplicates of each in the fetch


def scrape(registry: CollectorRegistry) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = generate_latest(registry).decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.mark.parametrize(("kind", "max_batch"), [("record", 1), ("record", 500),
                                                 ("batch", 500)])
async def test_every_duplicate_of_one_fetch_is_observed(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    kind: str, max_batch: int,
) -> None:
    topic = await ledger_topic(partitions=1)
    events = [Event(f"dup-{n}", f"key-{n % 2}", n) for n in range(DISTINCT)
              for _ in range(COPIES)]
    await publish(kafka_bootstrap, topic, events)  # all there before the first fetch
    applied: list[str] = []

    @handler("step.recorded")
    async def one(event: Step, ctx: HandlerContext) -> None:
        applied.append(ctx.envelope.event_id)

    @handler("step.recorded", batch=True)
    async def many(events: list[Step], ctx: BatchContext) -> None:
        applied.extend(e.event_id for e in ctx.envelopes)

    registry = CollectorRegistry()
    consumer = build(f"age-{kind}-{max_batch}", pg_schema, topic, postgres_dsn,
                     kafka_bootstrap, handlers=[one if kind == "record" else many],
                     limits=Limits(max_batch=max_batch),
                     registry=registry)
    async with Running(consumer):
        await wait(lambda: settled(consumer, len(events)), 60, "every copy settled")
    assert sorted(applied) == sorted({e.event_id for e in events})  # once each
    found = scrape(registry)

    def at(name: str, **labels: str) -> float:
        return found[name, frozenset({"consumer": consumer.name, **labels}.items())]

    duplicates = DISTINCT * (COPIES - 1)
    assert consumer.stats.duplicates == duplicates
    assert at("consumerkit_messages_total", topic=topic, outcome="duplicate") == duplicates
    assert at("consumerkit_duplicate_age_seconds_count") == duplicates
    # each original was applied moments before its copies: within the first minute
    assert at("consumerkit_duplicate_age_seconds_bucket", le="60.0") == duplicates
