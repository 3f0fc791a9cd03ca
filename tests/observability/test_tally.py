"""The per-message families, counted in plain integers, read back through the Prometheus text
format exactly as prometheus-client's own metrics would be."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from consumerkit.envelope import Envelope, Record
from consumerkit.observability.metrics import ConsumerMetrics

RECORD = Record("orders", 0, 7, b"k", b"{}", [])
ENVELOPE = Envelope("e-1", "header", "order.placed", "k", "orders", 0, 7, None)


def scrape(registry: CollectorRegistry) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = generate_latest(registry).decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_counts_and_histograms_read_back_cumulative() -> None:
    registry = CollectorRegistry()
    metrics = ConsumerMetrics(registry, "billing")
    for _ in range(3):
        metrics.applied(RECORD, ENVELOPE, "h")
    metrics.dead_lettered(RECORD, ENVELOPE, "h", "handler_failed", "boom", 3)
    an_hour_ago = datetime.now(UTC) - timedelta(hours=1)
    metrics.duplicate(RECORD, ENVELOPE, "h", an_hour_ago)
    metrics.duplicate(RECORD, None, "", None)  # recognised before decoding: no age
    for seconds in (0.001, 0.005, 0.3, 20.0):
        metrics.handler_finished("h", seconds)
    metrics.retry(RECORD, ENVELOPE, "h", 1, 0.1, RuntimeError("x"))

    found = scrape(registry)

    def at(name: str, **labels: str) -> float:
        return found[name, frozenset({"consumer": "billing", **labels}.items())]

    assert at("consumerkit_messages_total", topic="orders", outcome="applied") == 3
    assert at("consumerkit_messages_total", topic="orders", outcome="duplicate") == 2
    assert at("consumerkit_messages_total", topic="orders", outcome="dead_lettered") == 1
    assert at("consumerkit_retries_total", handler="h") == 1
    # le is inclusive: 0.005 falls in the 0.005 bucket, as prometheus-client counts it
    assert at("consumerkit_handler_seconds_bucket", handler="h", le="0.005") == 2
    assert at("consumerkit_handler_seconds_bucket", handler="h", le="0.25") == 2
    assert at("consumerkit_handler_seconds_bucket", handler="h", le="0.5") == 3
    assert at("consumerkit_handler_seconds_bucket", handler="h", le="10.0") == 3
    assert at("consumerkit_handler_seconds_bucket", handler="h", le="+Inf") == 4
    assert at("consumerkit_handler_seconds_count", handler="h") == 4
    assert abs(at("consumerkit_handler_seconds_sum", handler="h") - 20.306) < 1e-9
    assert at("consumerkit_duplicate_age_seconds_count") == 1
    assert at("consumerkit_duplicate_age_seconds_bucket", le="3600.0") == 0
    assert at("consumerkit_duplicate_age_seconds_bucket", le="21600.0") == 1
    # no cache configured: no cache series at all
    assert not [k for k in found if k[0].startswith("consumerkit_dedup_cache")]


def test_consumers_share_a_registry_and_a_rerun_goes_on_counting() -> None:
    registry = CollectorRegistry()
    ConsumerMetrics(registry, "billing").applied(RECORD, ENVELOPE, "h")
    ConsumerMetrics(registry, "shipping").applied(RECORD, ENVELOPE, "h")
    again = ConsumerMetrics(registry, "billing")  # the same consumer, run again
    again.applied(RECORD, ENVELOPE, "h")
    again.cache_lookup(2, 1, 0)

    found = scrape(registry)

    def applied(consumer: str) -> float:
        return found["consumerkit_messages_total", frozenset(
            {"consumer": consumer, "topic": "orders", "outcome": "applied"}.items())]

    assert applied("billing") == 2
    assert applied("shipping") == 1
    cache = {dict(labels)["result"]: v for (name, labels), v in found.items()
             if name == "consumerkit_dedup_cache_requests_total"}
    assert cache == {"hit": 2, "miss": 1, "error": 0}
    # one HELP and TYPE per family, however many consumers
    text = generate_latest(registry).decode()
    assert text.count("# TYPE consumerkit_messages_total counter") == 1


def test_stalls_show_as_a_gauge_and_a_counter_of_episodes() -> None:
    registry = CollectorRegistry()
    metrics = ConsumerMetrics(registry, "billing")
    billing = frozenset({("consumer", "billing")})

    def now() -> tuple[float, float]:
        found = scrape(registry)
        return found["consumerkit_stalled", billing], found["consumerkit_stalls_total", billing]

    assert now() == (0, 0)  # present from the start: an alert can tell 0 from absent
    metrics.stalled("handler h cannot run: undefined_table")
    metrics.stalled("handler h cannot run: undefined_table")  # told twice: one episode
    assert now() == (1, 1)
    metrics.stalled(None)
    assert now() == (0, 1)
    metrics.stalled("handler h failed for 5 keys in a row")
    assert now() == (1, 2)
    ConsumerMetrics(registry, "billing")  # a run again with the registry: not stalled yet
    assert now() == (0, 2)
