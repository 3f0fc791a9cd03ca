"""Traces with OpenTelemetry (the ``otel`` extra): producer context in the event headers, one
consumer span per message.

Without ``opentelemetry-api`` installed nothing here does any work: the import is tried once,
:func:`inject` returns the headers untouched, and the consumer gets no :class:`Tracing`.

The span follows the OpenTelemetry messaging conventions: kind CONSUMER, name
``"process <topic>"``, ``messaging.system=kafka``, ``messaging.operation=process``, the
destination, partition, offset and message id, a child of the context in the record's
``traceparent``/``tracestate`` headers. It starts when the handler first runs (or when the
outcome is known, for a duplicate) and ends with the outcome, set as
``consumerkit.outcome`` and ``consumerkit.duplicate``; a message left unfinished (revoked
partition, shutdown) ends its span with the outcome ``abandoned``.

A batch handler's call gets one span of its own, as the conventions ask for batch
processing: the root of a new trace, linked to the span of each of its messages, current while
the call runs (the events it publishes carry it on) and ended with it.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .observer import BaseObserver

if TYPE_CHECKING:
    from ..envelope import Envelope, RecordLike

try:  # once: absent, tracing costs nothing
    from opentelemetry import propagate, trace
    from opentelemetry.context import Context
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # pragma: no cover - depends on the installed extras
    propagate = trace = None  # type: ignore[assignment]


AVAILABLE = trace is not None
_OPEN_SPANS = 100_000  # a bound on spans open at once, should an outcome never be reported


def inject(headers: Mapping[str, str]) -> Mapping[str, str]:
    """``headers`` with the current trace context added (``traceparent``, ``tracestate``),
    unless they already carry one or no span is current."""
    if propagate is None or "traceparent" in headers:
        return headers
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return {**headers, **carrier} if carrier else headers


def default_tracing(consumer: str) -> Tracing | None:
    """A :class:`Tracing` when opentelemetry is installed and a tracer provider is set."""
    if trace is None or isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return None
    return Tracing(consumer=consumer)


class Tracing(BaseObserver):
    """One span per message, from ``tracer_provider`` (the global one by default)."""

    __slots__ = ("_spans", "consumer", "tracer")

    def __init__(self, *, tracer_provider: Any = None, consumer: str = "") -> None:
        if trace is None:
            from ..errors import ConfigurationError

            raise ConfigurationError(
                "tracing needs opentelemetry-api: pip install 'consumerkit[otel]'")
        self.tracer = trace.get_tracer("consumerkit", tracer_provider=tracer_provider)
        self.consumer = consumer
        self._spans: OrderedDict[tuple[str, int, int, str], Any] = OrderedDict()

    @contextlib.contextmanager
    def activate(self, envelope: Envelope) -> Iterator[None]:
        """Run the handler with the message's span current (its events carry it on)."""
        span = self._span(None, envelope)
        with trace.use_span(span, end_on_exit=False, record_exception=False,
                            set_status_on_exception=False):
            yield

    @contextlib.contextmanager
    def activate_batch(self, handler: str, envelopes: Sequence[Envelope]) -> Iterator[None]:
        """Run a batch handler's call in a span of its own (the messaging conventions for
        batch processing: one span, linked to each message's span), current while it runs so
        that the events it publishes carry it on; it ends with the call."""
        links = [trace.Link(self._span(None, env).get_span_context()) for env in envelopes]
        topics = sorted({env.topic for env in envelopes})
        attributes: dict[str, Any] = {
            "messaging.system": "kafka", "messaging.operation": "process",
            "messaging.operation.type": "process",
            "messaging.batch.message_count": len(envelopes), "consumerkit.handler": handler,
        }
        if len(topics) == 1:
            attributes["messaging.destination.name"] = topics[0]
        if self.consumer:
            attributes["messaging.consumer.group.name"] = self.consumer
        # a root of its own: its messages come from many traces, each reached by a link
        span = self.tracer.start_span(f"process {' '.join(topics)}", context=Context(),
                                      kind=SpanKind.CONSUMER, links=links,
                                      attributes=attributes)
        with trace.use_span(span, end_on_exit=True):
            yield

    def _span(self, record: RecordLike | None, envelope: Envelope | None) -> Any:
        key = _key(record, envelope)
        span = self._spans.get(key)
        if span is not None:
            return span
        topic, partition, offset, _ = key
        event_id = envelope.event_id if envelope is not None else ""
        headers = _text_headers(record, envelope)
        parent = propagate.extract(headers)
        attributes: dict[str, Any] = {
            "messaging.system": "kafka", "messaging.operation": "process",
            "messaging.operation.type": "process", "messaging.destination.name": topic,
            "messaging.kafka.destination.partition": partition,
            "messaging.destination.partition.id": str(partition),
            "messaging.kafka.message.offset": offset,
        }
        if event_id:
            attributes["messaging.message.id"] = event_id
        if self.consumer:
            attributes["messaging.consumer.group.name"] = self.consumer
            attributes["messaging.kafka.consumer.group"] = self.consumer
        if envelope is not None and envelope.key is not None:
            attributes["messaging.kafka.message.key"] = envelope.key
        span = self.tracer.start_span(f"process {topic}", context=parent,
                                      kind=SpanKind.CONSUMER, attributes=attributes)
        self._spans[key] = span
        if len(self._spans) > _OPEN_SPANS:
            self._spans.popitem(last=False)[1].end()
        return span

    def _end(self, record: RecordLike, envelope: Envelope | None, outcome: str,
             error: str | None = None) -> None:
        span = self._spans.pop(_key(record, envelope), None)
        if span is None:
            span = self._span(record, envelope)
            self._spans.pop(_key(record, envelope), None)
        span.set_attribute("consumerkit.outcome", outcome)
        span.set_attribute("consumerkit.duplicate", outcome == "duplicate")
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()

    def applied(self, record: RecordLike, envelope: Envelope, handler: str) -> None:
        self._end(record, envelope, "applied")

    def duplicate(self, record: RecordLike, envelope: Envelope | None, handler: str,
                  original_seen_at: datetime | None) -> None:
        self._end(record, envelope, "duplicate")

    def dead_lettered(self, record: RecordLike, envelope: Envelope | None, handler: str,
                      reason: str, detail: str, attempts: int) -> None:
        self._end(record, envelope, "dead_lettered", f"{reason}: {detail}"[:500])

    def expired_skipped(self, record: RecordLike, envelope: Envelope, handler: str) -> None:
        self._end(record, envelope, "expired_skipped")

    def parked(self, record: RecordLike, envelope: Envelope | None, handler: str,
               reason: str, detail: str, attempts: int) -> None:
        # the culprit failed; the records parked behind it did nothing wrong
        error = f"{reason}: {detail}"[:500] if attempts else None
        self._end(record, envelope, "parked", error)

    def abandoned(self, records: Sequence[RecordLike]) -> None:
        for record in records:
            span = self._spans.pop(_key(record, None), None)
            if span is not None:  # none when its handler never ran
                span.set_attribute("consumerkit.outcome", "abandoned")
                span.set_attribute("consumerkit.duplicate", False)
                span.end()

    def retry(self, record: RecordLike, envelope: Envelope, handler: str, attempt: int,
              delay: float, error: BaseException) -> None:
        span = self._spans.get(_key(record, envelope))
        if span is not None:
            span.add_event("retry", {"attempt": attempt, "delay": delay,
                                     "error": f"{type(error).__name__}: {error}"[:500]})


def _key(record: RecordLike | None, envelope: Envelope | None) -> tuple[str, int, int, str]:
    """A record's position; the event id only for a record without one (a webhook request,
    offset -1), so that a record abandoned before it was decoded finds its span."""
    if envelope is not None:
        return (envelope.topic, envelope.partition, envelope.offset,
                envelope.event_id if envelope.offset < 0 else "")
    assert record is not None
    return record.topic, record.partition, record.offset, ""


def _text_headers(record: RecordLike | None, envelope: Envelope | None) -> dict[str, str]:
    raw: Mapping[str, bytes | None] = (
        envelope.headers if envelope is not None else dict(record.headers or ()) if record
        else {})
    return {name: value.decode(errors="replace") for name, value in raw.items()
            if value is not None and name in ("traceparent", "tracestate")}
