"""A topic carrying five event types, a consumer handling two: with ``unhandled="skip"`` the
other three are skipped (counted per type, logged once per type, nothing written for them,
their offsets committed) and nothing is dead-lettered; with the default, ``dead_letter``,
they are dead-lettered (``unknown_event_type``); an ``ignore`` pattern skips its types
whatever the mode. And the outbox of a consumer (or of a test kit made ``like`` it) lives in
the consumer's schema unless it names its own."""

from __future__ import annotations

import logging
from collections import Counter

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from consumerkit import (
    ConfigurationError,
    Consumer,
    HandlerContext,
    Kafka,
    Outbox,
    Postgres,
    Unhandled,
    handler,
)
from consumerkit.deadletter.table import list_dead_letters
from consumerkit.engine.unhandled import Skipped
from consumerkit.errors import DecodeError
from consumerkit.observability.logging import LogObserver
from consumerkit.observability.metrics import OTHER_TYPES, SKIPPED_TYPES, ConsumerMetrics
from consumerkit.testing import TestConsumer
from consumerkit.testing.services import MakeTopic

from .ledger import Running, publish_raw, wait_for
from .shared_topic import HANDLED, UNHANDLED, Order, consumer, records, registry
from .test_offset_store import committed, stored

PER_TYPE = 3


async def test_skip_counts_the_unhandled_types_and_dead_letters_nothing(
    postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic, pg_schema: str,
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture,
) -> None:
    topic = await make_topic(partitions=2)
    await publish_raw(kafka_bootstrap, topic, records(PER_TYPE))
    taken: list[str] = []
    metrics = CollectorRegistry()
    shop = consumer(f"skip-{topic}", topic, pg_schema, taken=taken,
                    postgres=Postgres(dsn=postgres_dsn),
                    kafka=Kafka(bootstrap=kafka_bootstrap),
                    unhandled=Unhandled(policy="skip"),
                    registry=metrics)
    total = PER_TYPE * 5
    caplog.set_level(logging.INFO, logger="consumerkit")
    async with Running(shop):
        s = shop.stats
        await wait_for(lambda: _true(s.applied + s.unhandled_skipped + s.dead_lettered >= total),
                       60, "every record settled")
        await wait_for(lambda: _committed_all(kafka_bootstrap, shop.name, topic, total), 60,
                       "the offsets of every record committed")
    assert s.dead_lettered == 0
    assert s.applied == PER_TYPE * len(HANDLED)
    assert sorted(taken) == sorted(f"{t}/o-{n}" for t in HANDLED for n in range(PER_TYPE))
    assert s.skipped_types == Counter(dict.fromkeys(UNHANDLED, PER_TYPE))
    for event_type in UNHANDLED:
        assert metrics.get_sample_value("consumerkit_unhandled_skipped_total", {
            "consumer": shop.name, "topic": topic, "event_type": event_type}) == PER_TYPE
    async with pg_pool.acquire() as conn:
        assert not await list_dead_letters(conn, pg_schema, limit=100)
    # nothing written for a skipped record: dedup rows for the applied ones alone
    ids = await pg_pool.fetch(f'SELECT event_id FROM "{pg_schema}".processed_events_ids '
                              "WHERE namespace = $1", shop.name)
    assert sorted(r["event_id"] for r in ids) == sorted(taken)
    assert sum((await stored(pg_pool, pg_schema, shop.name)).values()) == total
    logged = [r.getMessage() for r in caplog.records if "skipping event type" in r.getMessage()]
    assert sorted(logged) == sorted(
        f"skipping event type {t!r}: no handler of consumer {shop.name} takes it (counted in "
        "consumerkit_unhandled_skipped_total; logged once per type)" for t in UNHANDLED)


async def test_dead_letter_by_default(
    postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    topic = await make_topic(partitions=2)
    await publish_raw(kafka_bootstrap, topic, records(PER_TYPE))
    shop = consumer(f"dl-{topic}", topic, pg_schema,
                    postgres=Postgres(dsn=postgres_dsn),
                    kafka=Kafka(bootstrap=kafka_bootstrap))
    total = PER_TYPE * 5
    async with Running(shop):
        s = shop.stats
        await wait_for(lambda: _true(s.applied + s.unhandled_skipped + s.dead_lettered >= total),
                       60, "every record settled")
    assert s.unhandled_skipped == 0
    async with pg_pool.acquire() as conn:
        letters = await list_dead_letters(conn, pg_schema, limit=100)
    assert Counter((e.event_type, e.reason) for e in letters) == Counter(
        {(t, "unknown_event_type"): PER_TYPE for t in UNHANDLED})


def test_ignore_patterns_skip_their_types_whatever_the_mode() -> None:
    decoder = Consumer(name="inventory", handlers=[registry(HANDLED)], topics=["orders"],
                       unhandled=Unhandled(ignore=["order.internal.*"])).decoder()
    by_type = {t: (key, value, headers) for key, value, headers in records(1)
               for t in [headers[1][1].decode()]}
    outcomes = {}
    for event_type, (key, value, headers) in by_type.items():
        record = _Record(key, value, headers)
        try:
            decoder.decode(record)
            outcomes[event_type] = "handled"
        except DecodeError as exc:
            outcomes[event_type] = exc.reason
    assert outcomes == {"order.created": "handled", "order.paid": "handled",
                        "order.shipped": "unknown_event_type",
                        "order.cancelled": "unknown_event_type",
                        "order.internal.audit": "unhandled_skipped"}


def test_a_misspelt_handler_is_named_where_its_events_go(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``order.craeted`` registered, ``order.created`` sent: the dead letter's detail says
    so, and under ``skip`` the first skip is a warning naming the handler's type."""
    created = next(_Record(*r) for r in records(1) if r[2][1][1] == b"order.created")
    misspelt = ("order.craeted", "order.paid")
    dead = Consumer(name="inventory", handlers=[registry(misspelt)], topics=["orders"])
    with pytest.raises(DecodeError) as raised:
        dead.decoder().decode(created)
    assert raised.value.detail == ("no handler for event type 'order.created' (a handler "
                                   "takes 'order.craeted': misspelt?)")
    skip = Consumer(name="inventory", handlers=[registry(misspelt)], topics=["orders"],
                    unhandled=Unhandled(policy="skip"))
    with pytest.raises(Skipped) as skipped:
        skip.decoder().decode(created)
    assert skipped.value.near == "order.craeted"
    caplog.set_level(logging.INFO, logger="consumerkit")
    LogObserver("inventory").unhandled_skipped(created, "order.created", "order.craeted")
    [line] = [r for r in caplog.records if "skipping" in r.getMessage()]
    assert line.levelno == logging.WARNING
    assert line.getMessage() == (
        "skipping event type 'order.created': no handler of consumer inventory takes it, but "
        "one takes 'order.craeted': misspelt? (logged once per type)")


def test_a_pattern_matching_a_handled_type_or_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"matches handled event type order\.paid"):
        Consumer(name="inventory", handlers=[registry(HANDLED)], topics=["orders"],
                 unhandled=Unhandled(ignore=["order.pa*"]))
    with pytest.raises(ConfigurationError, match=r"Unhandled\.policy must be 'dead_letter' or"):
        Unhandled(policy="drop")  # type: ignore[arg-type]


@handler("order.created")
async def announce(event: Order, ctx: HandlerContext) -> None:
    await ctx.publish(event_type="stock.reserved", aggregate_type="stock",
                      aggregate_id=event.order_id, payload={"order_id": event.order_id})


def test_the_outbox_follows_the_consumer_schema_unless_it_names_one() -> None:
    outbox = Outbox(table="outbox")
    shop = Consumer(name="inventory", handlers=[announce], topics=["orders"],
                    postgres=Postgres(schema="shop"),
                    outbox=outbox)
    assert shop.outbox is not None
    assert shop.outbox.table.events == '"shop"."outbox"'
    shop.set_options(postgres=Postgres(schema="shop_b"))  # as `consumerkit run --schema` does
    assert shop.outbox is not None
    assert shop.outbox.table.schema == "shop_b"
    assert outbox.table.schema == "consumerkit"  # on its own: the documented default
    named = Consumer(name="inventory", handlers=[announce], topics=["orders"],
                     postgres=Postgres(schema="shop"),
                     outbox=Outbox(schema="elsewhere"))
    assert named.outbox is not None
    assert named.outbox.table.schema == "elsewhere"


async def test_a_test_kit_like_a_consumer_writes_its_outbox_in_the_kit_schema(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool,
) -> None:
    shop = Consumer(name="inventory", handlers=[announce], topics=["orders"],
                    outbox=Outbox(table="outbox"))
    async with TestConsumer.like(shop, postgres=Postgres(dsn=postgres_dsn,
                                                         schema=pg_schema)) as kit:
        kit.publish(Order(order_id="o-1"), key="o-1")
        await kit.drain()
    rows = await pg_pool.fetch(f'SELECT type FROM "{pg_schema}".outbox')
    assert [r["type"] for r in rows] == ["stock.reserved"]


class _Record:
    """A broker record as the decoder reads it."""

    def __init__(self, key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        self.key, self.value, self.headers = key, value, headers
        self.topic, self.partition, self.offset, self.timestamp = "orders", 0, 0, None


async def _true(value: bool) -> bool:
    return value


async def _committed_all(bootstrap: str, name: str, topic: str, total: int) -> bool:
    return sum((await committed(bootstrap, name, topic, 2)).values()) >= total




def test_the_skipped_types_series_are_bounded() -> None:
    """Event types come from producers: past SKIPPED_TYPES, one series counts the rest."""
    metrics = CollectorRegistry()
    observer = ConsumerMetrics(metrics, "inventory")
    record = _Record(b"k", b"{}", [])
    for n in range(SKIPPED_TYPES + 5):
        observer.unhandled_skipped(record, f"type.{n}", None)
    observer.unhandled_skipped(record, "type.0", None)
    series = {s.labels["event_type"]: s.value for m in metrics.collect()
              if m.name == "consumerkit_unhandled_skipped" for s in m.samples
              if s.name.endswith("_total")}
    assert len(series) == SKIPPED_TYPES + 1
    assert series["type.0"] == 2
    assert series[OTHER_TYPES] == 5
