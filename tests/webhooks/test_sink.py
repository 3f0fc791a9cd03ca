"""WebhookSink against a real HTTP server scripted to accept, fail, refuse or hang: what it sends,
how it reads each answer, per-aggregate order within a batch, and that secrets stay secret."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import socket
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from uuid import uuid4

import pytest

from consumerkit import ConfigurationError, WebhookError, WebhookSink
from consumerkit.outbox.event import OutboxEvent
from consumerkit.outbox.sink import PermanentSendError
from consumerkit.outbox.webhook import BlockedByEarlierEvent
from consumerkit.shared.webhook.status import retry_after

from .conftest import Reply, ScriptedEndpoint

Endpoint = tuple[ScriptedEndpoint, str]
_seq = itertools.count(1)
AT = datetime(2024, 5, 1, 12, 30, tzinfo=UTC)


def event(aggregate: str = "o-1", *, event_type: str = "order.paid", attempts: int = 0,
          headers: dict[str, str] | None = None, payload: bytes | None = None) -> OutboxEvent:
    body = payload if payload is not None else b'{"order_id": "%s", "amount": 3}' % (
        aggregate.encode())
    return OutboxEvent(seq=next(_seq), event_id=uuid4(), event_type=event_type,
                       aggregate_type="order", aggregate_id=aggregate, payload=body,
                       occurred_at=AT, headers=headers or {}, attempts=attempts)


@contextlib.asynccontextmanager
async def opened(sink: WebhookSink) -> AsyncIterator[WebhookSink]:
    await sink.open()
    try:
        yield sink
    finally:
        await sink.close()


# -- acceptance ------------------------------------------------------------------------------

async def test_a_receiver_that_fails_twice_times_out_once_then_accepts_gets_the_event(
    endpoint: Endpoint,
) -> None:
    """Each call is one relay attempt after its back-off: the event is delivered on the 4th,
    every attempt carried the same body and Idempotency-Key, and each failure was retriable."""
    app, url = endpoint
    outbox_event = event()
    key = str(outbox_event.event_id)
    app.script(key, Reply(500, body=b"database down"), Reply(503, (("Retry-After", "7"),)),
               Reply(hang=True), Reply(200))
    results: list[BaseException | None] = []
    async with opened(WebhookSink(f"{url}/hooks", timeout=2.0)) as sink:
        attempt = outbox_event
        while not results or results[-1] is not None:
            assert len(results) < 10, results
            [result] = await sink.send([attempt])
            results.append(result)
            attempt = dataclasses.replace(outbox_event, attempts=len(results))

    first, second, third, fourth = results
    assert isinstance(first, WebhookError)
    assert (first.status, first.retry_after) == (500, None)
    assert "answered 500: database down" in str(first)
    assert isinstance(second, WebhookError)
    assert (second.status, second.retry_after) == (503, 7.0)
    assert isinstance(third, WebhookError)
    assert third.status is None
    assert "timed out after 2.0s" in str(third)
    assert fourth is None
    assert [r.key for r in app.requests] == [key] * 4
    assert {r.body for r in app.requests} == {outbox_event.payload}
    assert [r.headers["x-event-attempt"] for r in app.requests] == ["1", "2", "3", "4"]


# -- what is sent ----------------------------------------------------------------------------

async def test_the_request_carries_the_payload_and_the_event_headers(endpoint: Endpoint) -> None:
    app, url = endpoint
    sent = event("Zürich-7", attempts=2, headers={
        "correlation_id": "c-1", "traceparent": "00-abc-def-01", "occurred_at": "ignored"})
    async with opened(WebhookSink(f"{url}/in", headers={"Authorization": "Bearer t"})) as sink:
        assert await sink.send([sent]) == [None]
    [request] = app.requests
    assert request.path == "/in"
    assert request.body == sent.payload
    raw = dict(request.raw_headers)
    assert raw[b"x-event-aggregate-id"] == "Zürich-7".encode()  # UTF-8, intact
    headers = request.headers
    assert headers["content-type"] == "application/json"
    assert headers["idempotency-key"] == str(sent.event_id)
    assert headers["x-event-type"] == "order.paid"
    assert headers["x-event-occurred-at"] == "2024-05-01T12:30:00+00:00"
    assert headers["x-event-aggregate-type"] == "order"
    assert headers["x-event-attempt"] == "3"
    assert headers["x-event-correlation-id"] == "c-1"
    assert headers["x-event-traceparent"] == "00-abc-def-01"
    assert headers["authorization"] == "Bearer t"
    # an outbox header cannot replace one the sink sets itself
    assert [n for n, _ in request.raw_headers].count(b"x-event-occurred-at") == 1


async def test_a_routing_function_chooses_the_url_per_event(endpoint: Endpoint) -> None:
    app, url = endpoint
    paid, refunded, broken = event("o-1"), event("o-2", event_type="order.refunded"), event(
        "o-3", event_type="order.lost")

    def route(e: OutboxEvent) -> str:
        return f"ftp://{url[7:]}/x" if e.event_type == "order.lost" else f"{url}/{e.event_type}"

    async with opened(WebhookSink(route)) as sink:
        results = await sink.send([paid, refunded, broken])
    assert results[:2] == [None, None]
    assert isinstance(results[2], ConfigurationError)  # retried once the function is fixed
    assert sorted(r.path for r in app.requests) == ["/order.paid", "/order.refunded"]


# -- how answers are read ----------------------------------------------------------------------

@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 410, 413, 422])
async def test_a_4xx_answer_is_a_permanent_failure(endpoint: Endpoint, status: int) -> None:
    app, url = endpoint
    app.replies.append(Reply(status, body=b'{"error": "nope"}'))
    async with opened(WebhookSink(url)) as sink:
        [result] = await sink.send([event()])
    assert isinstance(result, PermanentSendError)
    assert f"answered {status}" in str(result)
    assert '{"error": "nope"}' in str(result)


@pytest.mark.parametrize(("status", "header", "wait"), [
    (408, None, None), (429, "3", 3.0), (500, None, None), (502, None, None), (503, "0", 0.0),
    (504, "soon", None),
])
async def test_408_429_and_5xx_answers_are_retriable(
    endpoint: Endpoint, status: int, header: str | None, wait: float | None,
) -> None:
    app, url = endpoint
    app.replies.append(Reply(status, (("Retry-After", header),) if header else ()))
    async with opened(WebhookSink(url)) as sink:
        [result] = await sink.send([event()])
    assert isinstance(result, WebhookError)
    assert not isinstance(result, PermanentSendError)
    assert (result.status, result.retry_after) == (status, wait)


def test_retry_after_reads_seconds_and_http_dates() -> None:
    now = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    assert retry_after("120", now) == 120.0
    assert retry_after("Wed, 01 May 2024 12:00:30 GMT", now) == 30.0
    assert retry_after("Wed, 01 May 2024 11:00:00 GMT", now) == 0.0
    assert retry_after("-1", now) is None
    assert retry_after(None, now) is None


async def test_a_redirect_is_not_followed_and_is_permanent(endpoint: Endpoint) -> None:
    app, url = endpoint
    app.replies.append(Reply(307, (("Location", f"{url}/elsewhere"),)))
    async with opened(WebhookSink(f"{url}/old")) as sink:
        [result] = await sink.send([event()])
    assert isinstance(result, PermanentSendError)
    assert "redirects are not followed" in str(result)
    assert [r.path for r in app.requests] == ["/old"]


async def test_a_refused_connection_is_retriable() -> None:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        async with opened(WebhookSink(f"http://127.0.0.1:{port}/x", timeout=5)) as sink:
            [result] = await sink.send([event()])
    assert isinstance(result, WebhookError)
    assert result.status is None
    assert "ConnectError" in str(result)


@pytest.mark.parametrize(("status", "delivered"), [(200, True), (503, False)])
async def test_an_unreadable_answer_body_only_matters_for_a_failure(
    endpoint: Endpoint, status: int, delivered: bool,
) -> None:
    app, url = endpoint
    app.replies.append(Reply(status, (("Content-Encoding", "gzip"),), body=b"not gzip at all"))
    async with opened(WebhookSink(url)) as sink:
        [result] = await sink.send([event()])
    if delivered:
        assert result is None  # a 2xx is enough: the body is not read
    else:
        assert isinstance(result, WebhookError)
        assert "DecodingError" in str(result)


async def test_an_unsendable_header_value_is_permanent(endpoint: Endpoint) -> None:
    app, url = endpoint
    async with opened(WebhookSink(url)) as sink:
        results = await sink.send([event("line\nbreak"), event("ok")])
    assert isinstance(results[0], PermanentSendError)
    assert "would not arrive intact" in str(results[0])
    assert results[1] is None
    assert len(app.requests) == 1


async def test_send_before_open_fails_the_batch() -> None:
    with pytest.raises(RuntimeError, match="before open"):
        await WebhookSink("http://127.0.0.1:9/x").send([event()])


# -- order within a batch ----------------------------------------------------------------------

async def test_events_of_one_aggregate_are_posted_one_after_another(endpoint: Endpoint) -> None:
    """a1 is held until b1 has arrived: the aggregates run side by side, yet a2 is not posted
    before a1 is answered, and a3 not before a2."""
    app, url = endpoint
    a1, a2, a3, b1, b2 = event("a"), event("a"), event("a"), event("b"), event("b")
    app.script(str(a1.event_id), Reply(gate=app.arrival(str(b1.event_id))))
    async with opened(WebhookSink(url, concurrency=4)) as sink:
        results = await asyncio.wait_for(sink.send([a1, b1, a2, b2, a3]), timeout=10)
    assert results == [None] * 5
    arrived = [r.key for r in app.requests]
    keys_a = [str(e.event_id) for e in (a1, a2, a3)]
    assert [k for k in arrived if k in keys_a] == keys_a
    assert arrived.index(str(b1.event_id)) < arrived.index(str(a2.event_id))
    for earlier, later in itertools.pairwise(keys_a):  # answered before the next was sent
        assert app.answered.index(earlier) < arrived.index(later)


async def test_a_failure_blocks_the_rest_of_its_aggregate_only(endpoint: Endpoint) -> None:
    app, url = endpoint
    a1, a2, a3, b1 = event("a"), event("a"), event("a"), event("b")
    app.script(str(a2.event_id), Reply(500))
    async with opened(WebhookSink(url)) as sink:
        results = await sink.send([a1, a2, b1, a3])
    assert results[0] is None
    assert isinstance(results[1], WebhookError)
    assert results[2] is None
    blocked = results[3]
    assert isinstance(blocked, BlockedByEarlierEvent)
    assert (blocked.event_id, blocked.blocker) == (a3.event_id, a2.event_id)
    assert "blocked by earlier event" in str(blocked)
    assert str(a3.event_id) not in [r.key for r in app.requests]


async def test_concurrency_bounds_the_requests_in_flight(endpoint: Endpoint) -> None:
    app, url = endpoint
    gate = asyncio.Event()
    events = [event(f"agg-{n}") for n in range(6)]
    for e in events:
        app.script(str(e.event_id), Reply(gate=gate))
    async with opened(WebhookSink(url, concurrency=2)) as sink:
        sending = asyncio.create_task(sink.send(events))
        await asyncio.wait_for(app.arrival(str(events[1].event_id)).wait(), timeout=10)
        await asyncio.sleep(0)  # let a third request start, if the bound failed
        assert app.in_flight == 2
        gate.set()
        assert await asyncio.wait_for(sending, timeout=10) == [None] * 6
    assert app.max_in_flight == 2


# -- configuration and secrets -----------------------------------------------------------------

@pytest.mark.parametrize("url", ["ftp://example.com/x", "/relative", "example.com/x",
                                 "http://", "https:///path", "javascript:alert(1)"])
def test_a_url_that_is_not_http_is_refused(url: str) -> None:
    with pytest.raises(ConfigurationError, match="absolute http"):
        WebhookSink(url)


@pytest.mark.parametrize("headers", [{"Idempotency-Key": "x"}, {"X-Event-Type": "x"},
                                     {"x-event-custom": "x"}, {"Content-Type": "text/plain"},
                                     {"Bad Name": "x"}, {"Authorization": "a\r\nb"}])
def test_headers_that_would_break_the_protocol_are_refused(headers: dict[str, str]) -> None:
    with pytest.raises(ConfigurationError):
        WebhookSink("https://example.com/x", headers=headers)


@pytest.mark.parametrize("kwargs", [{"timeout": 0}, {"concurrency": 0}])
def test_bad_limits_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError):
        WebhookSink("https://example.com/x", **kwargs)  # type: ignore[arg-type]


async def test_secrets_never_reach_logs_errors_or_repr(
    endpoint: Endpoint, caplog: pytest.LogCaptureFixture,
) -> None:
    app, url = endpoint
    secret = "s3cr3t-token-value"
    app.replies.extend([Reply(500), Reply(404), Reply(hang=True)])
    sink = WebhookSink(f"{url}/hook?sig=abc", timeout=0.3,
                       headers={"Authorization": f"Bearer {secret}"})
    with caplog.at_level(logging.DEBUG):
        async with opened(sink):
            results = [*await sink.send([event()]), *await sink.send([event()]),
                       *await sink.send([event()])]
    assert app.requests[0].headers["authorization"] == f"Bearer {secret}"  # it was sent
    shown = [repr(sink), *map(str, results), caplog.text]
    assert all(r is not None for r in results)
    for text in shown:
        assert secret not in text
    assert "Authorization" in repr(sink)
    assert all("/hook" in str(r) and "sig=abc" not in str(r) for r in results)


@pytest.mark.parametrize("password", ["hunter2", "hun/ter2", "hun?ter2", "hun#ter2",
                                      "hun@ter2"])
def test_credentials_in_the_url_are_refused_without_showing_them(password: str) -> None:
    with pytest.raises(ConfigurationError, match="headers=") as info:
        WebhookSink(f"https://user:{password}@example.com/hook")
    assert "hun" not in str(info.value)
    assert "ter2" not in str(info.value)
    assert "https://user:***@example.com/hook" in str(info.value)


async def test_a_sink_can_be_reopened(endpoint: Endpoint) -> None:
    _app, url = endpoint
    sink = WebhookSink(url)
    async with opened(sink):
        assert await sink.send([event()]) == [None]
    async with opened(sink):
        assert await sink.send([event()]) == [None]

