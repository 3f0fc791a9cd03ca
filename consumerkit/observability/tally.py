"""Per-message counts (and a consumer's stalls) kept in plain integers and turned into metric
families at scrape time.

A prometheus-client ``Counter.inc`` takes a lock and a ``Histogram.observe`` walks its
buckets, each a locked value: per message that was most of what metrics cost a consumer. Here
a message costs a dict lookup and an integer increment (a histogram adds a ``bisect``), and
the work of building the families is done when ``/metrics`` is read, a few times a minute.

The counts are only ever changed from the consumer's event loop. A scrape from another thread
reads copies (``list(d.items())`` runs without releasing the GIL), so it sees every count as
it was at some moment, never a torn one.
"""

from __future__ import annotations

import weakref
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import cast

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString


@dataclass(frozen=True, slots=True)
class Spec:
    """A metric family: its name as registered (counters without ``_total``), type, help
    text and label names."""

    name: str
    kind: str
    doc: str
    labels: tuple[str, ...]


HANDLER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                   10.0)
# from a second to a month: the dedup window is usually days
AGE_BUCKETS = (1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 6 * 3600.0, 86400.0, 3 * 86400.0,
               7 * 86400.0, 14 * 86400.0, 30 * 86400.0)

MESSAGES = Spec("consumerkit_messages", "counter", "Messages by final outcome",
                ("consumer", "topic", "outcome"))
HANDLER = Spec("consumerkit_handler_seconds", "histogram", "Handler run time (every attempt)",
               ("consumer", "handler"))
RETRIES = Spec("consumerkit_retries", "counter",
               "Handler attempts that failed and will be retried", ("consumer", "handler"))
AGE = Spec("consumerkit_duplicate_age_seconds", "histogram",
           "At each duplicate, how long ago the original was applied", ("consumer",))
CACHE = Spec("consumerkit_dedup_cache_requests", "counter",
             "Event ids asked of the dedup cache, by answer", ("consumer", "result"))
STALLED = Spec("consumerkit_stalled", "gauge",
               "1 while a failure every record would hit stalls the consumer (/readyz says "
               "which), else 0", ("consumer",))
STALLS = Spec("consumerkit_stalls", "counter",
              "Times a failure every record would hit stalled the consumer", ("consumer",))
TALLIED = (MESSAGES, HANDLER, RETRIES, AGE, CACHE, STALLED, STALLS)
"""The consumer's families kept by :class:`Tally`: per message, and its stalls."""

CACHE_RESULTS = ("hit", "miss", "error")

_go_float = cast(Callable[[float], str], floatToGoString)


class Buckets:
    """A histogram's counts: ``counts[i]`` observations at most ``bounds[i]`` and above the
    bound before (the last one above every bound), and their sum."""

    __slots__ = ("bounds", "counts", "les", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.les = [_go_float(b) for b in (*self.bounds, float("inf"))]  # as Prometheus writes
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for le, count in zip(self.les, list(self.counts), strict=True):
            running += count
            out.append((le, running))
        return out


class Tally:
    """One consumer's per-message counts (see the module's text)."""

    __slots__ = ("age", "cache", "cache_seen", "consumer", "handlers", "messages", "retries",
                 "stalled", "stalls")

    def __init__(self, consumer: str) -> None:
        self.consumer = consumer
        self.messages: dict[tuple[str, str], int] = {}  # (topic, outcome) -> count
        self.handlers: dict[str, Buckets] = {}
        self.retries: dict[str, int] = {}
        self.age = Buckets(AGE_BUCKETS)
        self.cache = [0, 0, 0]  # as CACHE_RESULTS
        self.cache_seen = False
        self.stalled = 0  # 1 while stalled
        self.stalls = 0

    def stall(self, reason: str | None) -> None:
        if reason is not None and not self.stalled:
            self.stalls += 1
        self.stalled = 0 if reason is None else 1

    def count(self, topic: str, outcome: str) -> None:
        key = (topic, outcome)
        messages = self.messages
        messages[key] = messages.get(key, 0) + 1

    def handler_finished(self, handler: str, seconds: float) -> None:
        buckets = self.handlers.get(handler)
        if buckets is None:
            buckets = self.handlers[handler] = Buckets(HANDLER_BUCKETS)
        buckets.observe(seconds)

    def retry(self, handler: str) -> None:
        self.retries[handler] = self.retries.get(handler, 0) + 1


class TallyCollector(Collector):
    """The families of every :class:`Tally` of one registry, built at each scrape."""

    def __init__(self) -> None:
        self.tallies: dict[str, Tally] = {}

    def tally(self, consumer: str) -> Tally:
        """The counts of ``consumer``: a consumer run again with the same registry goes on
        counting where it stopped, as a prometheus-client child would."""
        found = self.tallies.get(consumer)
        if found is None:
            found = self.tallies[consumer] = Tally(consumer)
        return found

    def describe(self) -> list[Metric]:
        return [_family(s) for s in TALLIED]

    def collect(self) -> Iterator[Metric]:
        messages, retries, cache = _counter(MESSAGES), _counter(RETRIES), _counter(CACHE)
        handler, age = _histogram(HANDLER), _histogram(AGE)
        stalled, stalls = _gauge(STALLED), _counter(STALLS)
        for t in list(self.tallies.values()):
            c = t.consumer
            for (topic, outcome), n in list(t.messages.items()):
                messages.add_metric([c, topic, outcome], n)
            for name, buckets in list(t.handlers.items()):
                handler.add_metric([c, name], buckets.cumulative(), buckets.total)
            for name, n in list(t.retries.items()):
                retries.add_metric([c, name], n)
            age.add_metric([c], t.age.cumulative(), t.age.total)
            if t.cache_seen:  # present only for a consumer with a cache, as documented
                for result, n in zip(CACHE_RESULTS, list(t.cache), strict=True):
                    cache.add_metric([c, result], n)
            stalled.add_metric([c], t.stalled)
            stalls.add_metric([c], t.stalls)
        yield from (messages, handler, retries, age, cache, stalled, stalls)


def _family(spec: Spec) -> Metric:
    if spec.kind == "counter":
        return _counter(spec)
    return _gauge(spec) if spec.kind == "gauge" else _histogram(spec)


def _counter(spec: Spec) -> CounterMetricFamily:
    return CounterMetricFamily(spec.name, spec.doc, labels=spec.labels)


def _gauge(spec: Spec) -> GaugeMetricFamily:
    return GaugeMetricFamily(spec.name, spec.doc, labels=spec.labels)


def _histogram(spec: Spec) -> HistogramMetricFamily:
    return HistogramMetricFamily(spec.name, spec.doc, labels=spec.labels)


_COLLECTORS: weakref.WeakKeyDictionary[CollectorRegistry, TallyCollector] = (
    weakref.WeakKeyDictionary())


def collector(registry: CollectorRegistry) -> TallyCollector:
    """The tally collector of ``registry``, registered on first use (a consumer and a webhook
    receiver may share a registry)."""
    found = _COLLECTORS.get(registry)
    if found is None:
        found = _COLLECTORS[registry] = TallyCollector()
        registry.register(found)
    return found
