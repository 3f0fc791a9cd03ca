"""The observer seam: a fan-out calls, per method, the observers that override it, in order;
the stats and the log lines follow what they are told."""

from __future__ import annotations

import logging
import subprocess
import sys
from datetime import UTC, datetime
from typing import cast

import pytest

from consumerkit.envelope import Envelope, Record
from consumerkit.observability import BaseObserver, LogObserver, fanout
from consumerkit.observability.observer import METHODS, Observer
from consumerkit.stats import ConsumerStats, StatsObserver

RECORD = Record("orders", 2, 41, b"o-1", b"{}", [("id", b"e-1")])
ENVELOPE = Envelope("e-1", "header", "order.placed", "o-1", "orders", 2, 41, None)


class Applied(BaseObserver):
    def __init__(self, calls: list[str], name: str) -> None:
        self.calls = calls
        self.name = name

    def applied(self, record: object, envelope: object, handler: str) -> None:
        self.calls.append(f"{self.name}:{handler}")


class Everything:
    """A plain implementation of the Protocol, without BaseObserver: every method is called."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> object:
        if name not in METHODS:
            raise AttributeError(name)
        return lambda *args: self.calls.append(name)


def test_fanout_calls_only_the_observers_that_override_a_method_in_order() -> None:
    calls: list[str] = []
    both = fanout([Applied(calls, "a"), Applied(calls, "b")])
    both.applied(RECORD, ENVELOPE, "bill")
    both.retry(RECORD, ENVELOPE, "bill", 1, 0.1, ValueError())  # nobody overrides it
    assert calls == ["a:bill", "b:bill"]
    stats = StatsObserver(ConsumerStats())
    assert fanout([stats]) is stats  # consumerkit's own, alone: called directly


class Raising(BaseObserver):
    def applied(self, record: object, envelope: object, handler: str) -> None:
        raise RuntimeError("observer bug")


def test_an_observer_from_outside_consumerkit_is_guarded_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[str] = []
    stats = ConsumerStats()
    observer = fanout([Raising(), StatsObserver(stats), Applied(calls, "after")])
    with caplog.at_level(logging.ERROR, logger="consumerkit.observer"):
        for _ in range(3):
            observer.applied(RECORD, ENVELOPE, "bill")
    assert calls == ["after:bill"] * 3  # the observers after it are still called
    assert stats.applied == 3
    [line] = [r for r in caplog.records if r.name == "consumerkit.observer"]
    assert "Raising.applied raised (1 times so far)" in line.getMessage()
    assert line.exc_info is not None
    alone = fanout([Raising()])  # alone too
    alone.applied(RECORD, ENVELOPE, "bill")


def test_fanout_binds_a_lone_overrider_directly() -> None:
    stats = ConsumerStats()
    observer = fanout([StatsObserver(stats), LogObserver("c")])
    assert observer.applied.__self__ is not observer  # type: ignore[attr-defined]
    observer.delivered(3)
    observer.applied(RECORD, ENVELOPE, "bill")
    observer.duplicate(RECORD, None, "", datetime.now(UTC))
    observer.dead_lettered(RECORD, ENVELOPE, "bill", "handler_failed", "boom", 4)
    observer.abandoned([RECORD, RECORD])
    observer.retry(RECORD, ENVELOPE, "bill", 1, 0.5, ValueError("x"))
    assert (stats.delivered, stats.applied, stats.duplicates, stats.dead_lettered,
            stats.abandoned, stats.retries) == (3, 1, 1, 1, 2, 1)
    assert stats.dead_letter_reasons == {"handler_failed": 1}


def test_a_plain_protocol_implementation_gets_every_call() -> None:
    plain = Everything()
    observer = fanout([cast(Observer, plain), BaseObserver()])
    observer.lag("orders", 0, 5)
    observer.readiness("consumer", "c", None)
    assert plain.calls == ["lag", "readiness"]


def test_outcome_log_lines_carry_the_message_fields(caplog: pytest.LogCaptureFixture) -> None:
    observer = LogObserver("billing")
    with caplog.at_level(logging.DEBUG, logger="consumerkit.pipeline"):
        observer.retry(RECORD, ENVELOPE, "bill", 2, 0.5, ValueError("x"))
        observer.duplicate(RECORD, None, "", None)
    retry, duplicate = caplog.records
    assert (retry.event_id, retry.key, retry.partition, retry.offset, retry.handler,  # type: ignore[attr-defined]
            retry.attempt, retry.consumer) == ("e-1", "o-1", 2, 41, "bill", 2, "billing")  # type: ignore[attr-defined]
    # without an envelope (recognised by the cache before decoding): the record's position
    assert (duplicate.topic, duplicate.offset, duplicate.key) == ("orders", 41, "o-1")  # type: ignore[attr-defined]
    assert not hasattr(duplicate, "event_id")


def test_without_opentelemetry_nothing_is_traced_or_injected() -> None:
    script = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "from consumerkit.observability import tracing\n"
        "headers = {'a': 'b'}\n"
        "assert tracing.AVAILABLE is False\n"
        "assert tracing.inject(headers) is headers\n"
        "assert tracing.default_tracing('c') is None\n"
        "try:\n"
        "    tracing.Tracing()\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ConfigurationError tracing needs opentelemetry-api")


def test_with_opentelemetry_the_current_span_goes_into_the_headers() -> None:
    from opentelemetry.sdk.trace import TracerProvider

    from consumerkit.observability.tracing import inject

    assert inject({"a": "b"}) == {"a": "b"}  # no span current: nothing to carry on
    with TracerProvider().get_tracer("t").start_as_current_span("s") as span:
        carried = inject({"a": "b"})
        assert carried["traceparent"].split("-")[1] == f"{span.get_span_context().trace_id:032x}"
        kept = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
        assert inject(kept) is kept
