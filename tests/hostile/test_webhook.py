"""Hostile requests against the real webhook receiver (ASGI, driven in process by httpx) on real
PostgreSQL: every request answered 2xx or 4xx, never 5xx for what the sender got wrong; no
webhook id applied twice; answers and text logs one safe, bounded line of text; the version
read from the header the sink writes."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import TypeAlias

import asyncpg
import httpx
import orjson
import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import strategies as st

from consumerkit import Postgres, WebhookReceiver

from ..webhooks.handlers import with_search_path
from .handlers import EVENT_TYPES, create_items, items_by_event, registry
from .logtext import check_lines, text_logs, unsafe
from .strategies import (
    LINE_LIMIT,
    dumps,
    event_ids,
    examples,
    hostile_bytes,
    hostile_text,
    raw_values,
    versions,
)

Pool: TypeAlias = "asyncpg.Pool[asyncpg.Record]"
Headers: TypeAlias = list[tuple[bytes, bytes]]
VERSION_HEADER = b"X-Event-Event-Version"  # as consumerkit.webhook's sink writes it


@pytest_asyncio.fixture(loop_scope="session")
async def client(postgres_dsn: str, pg_schema: str, pg_pool: Pool,
                 ) -> AsyncIterator[httpx.AsyncClient]:
    """An unsigned receiver (the signature is checked before anything is parsed: unsigned,
    every request reaches the decoder) over the hostile handlers, shared by all examples."""
    await create_items(pg_pool, pg_schema)
    receiver = WebhookReceiver(
        [registry], namespace="hostile", allow_unsigned=True,
        postgres=Postgres(dsn=with_search_path(postgres_dsn, pg_schema), schema=pg_schema),
        max_body_bytes=64_000,
        pool_size=3)
    async with receiver, httpx.AsyncClient(transport=httpx.ASGITransport(app=receiver),
                                           base_url="http://hostile", timeout=30) as http:
        yield http


def _text(value: str) -> bytes:
    return value.encode()


header_values = st.one_of(hostile_bytes, st.text(max_size=10).map(_text))
ids = st.one_of(st.sampled_from(["w-1", "w-2", "w-3"]), event_ids)  # few: they collide
bodies = st.one_of(
    raw_values,
    st.builds(lambda i, n, w: dumps({"id": i, "n": n, "where": w, "place": w}), hostile_text,
              st.one_of(st.integers(-3, 3), st.integers()), hostile_text),
)


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, str, Headers, bytes]:
    """A request as a sender (honest, broken or malicious) might make it."""
    headers: Headers = []
    optional = [
        (b"Idempotency-Key", ids.map(_text) | header_values),
        (b"webhook-id", ids.map(_text) | header_values),
        (b"X-Event-Type", st.sampled_from(EVENT_TYPES).map(_text) | hostile_bytes),
        (VERSION_HEADER, versions),
        (b"X-Event-Occurred-At", header_values),
        (b"X-Event-Aggregate-Id", header_values),
        (b"X-Event-Attempt", header_values | st.integers().map(lambda n: str(n).encode())),
        (b"X-Event-Correlation-Id", header_values),
        (b"X-Event-Headers", header_values),
    ]
    for name, values in optional:
        if draw(st.booleans()):
            headers.append((name, draw(values)))
    headers += draw(st.lists(st.tuples(st.sampled_from([b"X-Event-", b"X-Event-Id", b"X-Junk"]),
                                       hostile_bytes), max_size=2))
    method = draw(st.sampled_from(["POST", "POST", "POST", "PUT", "GET"]))
    path = draw(st.sampled_from(["/", "/items", "/%0a%1b", "/" + "p" * 5000]))
    return method, path, draw(st.permutations(headers)), draw(bodies)


def check_answer(reply: httpx.Response) -> dict[str, object]:
    """The answer's JSON, after checking it is one a sender can act on and show safely."""
    assert len(reply.content) <= LINE_LIMIT, f"a body of {len(reply.content)} bytes"
    answer = orjson.loads(reply.content)
    assert isinstance(answer, dict)
    for name, value in answer.items():
        if isinstance(value, str):
            why = unsafe(value)
            assert why is None, f"{name} {why}: {value[:200]!r}"
    return answer


@examples(60)
@given(batch=st.lists(requests(), min_size=1, max_size=3), again=st.booleans())
async def test_every_request_is_answered_2xx_or_4xx_and_no_id_is_applied_twice(
    client: httpx.AsyncClient, pg_pool: Pool, pg_schema: str,
    batch: list[tuple[str, str, Headers, bytes]], again: bool,
) -> None:
    applied: list[str] = []
    with text_logs("consumerkit", "asyncpg") as lines:
        for method, path, headers, body in batch + batch[:1] * again:
            reply = await client.request(method, path, headers=headers, content=body)
            answer = check_answer(reply)
            assert reply.status_code < 500, f"{reply.status_code} {answer}"
            assert reply.status_code >= 200, reply.status_code
            if answer.get("status") == "applied":
                applied.append(str(answer["event_id"]))
    check_lines(lines)
    effects = await items_by_event(pg_pool, pg_schema)
    assert all(count == 1 for count in effects.values()), effects
    for event_id in applied:  # applied now, so never before (the ids repeat across examples)
        assert effects.get(event_id) == 1
    assert len(applied) == len(set(applied)), applied


@examples(40)
@given(version=versions)
async def test_the_version_is_read_from_the_header_the_sink_writes(
    client: httpx.AsyncClient, pg_pool: Pool, pg_schema: str, version: bytes,
) -> None:
    event_id = str(uuid.uuid4())  # new in every example, and in every shrinking step
    body = orjson.dumps({"id": "i", "n": 1, "where": "w", "place": "p"})  # v1 and v2 alike
    reply = await client.post("/", content=body, headers=[
        (b"Idempotency-Key", event_id.encode()), (b"X-Event-Type", b"item.moved"),
        (VERSION_HEADER, version)])
    answer = check_answer(reply)
    text = version.decode(errors="replace").strip()
    number = int(text) if text.isascii() and text.isdigit() else None
    applied = (await items_by_event(pg_pool, pg_schema)).get(event_id, 0)
    if number in (1, 2):
        assert (reply.status_code, applied) == (200, 1), answer
    else:
        assert 400 <= reply.status_code < 500, f"version {version!r}: {answer}"
        assert applied == 0
        assert answer["error"] in {"invalid_version", "unknown_version"}, answer


@pytest.mark.parametrize("version", [b"1", b"2"])
async def test_a_version_the_handler_takes_is_applied(
    client: httpx.AsyncClient, pg_pool: Pool, pg_schema: str, version: bytes,
) -> None:
    """The two good versions on their own (the property above draws them among many)."""
    body = orjson.dumps({"id": "i", "n": 1, "where": "w", "place": "p"})
    key = f"v{version.decode()}-{pg_schema}"
    reply = await client.post("/", content=body, headers=[
        (b"Idempotency-Key", key.encode()), (b"X-Event-Type", b"item.moved"),
        (VERSION_HEADER, version)])
    assert reply.status_code == 200, reply.text
    assert (await items_by_event(pg_pool, pg_schema)).get(key) == 1


@examples(15)
@given(item=hostile_text, n=st.one_of(st.integers(max_value=-1), st.integers(min_value=2**31)),
       nul=st.booleans())
async def test_a_payload_the_database_refuses_is_a_4xx_not_a_500(
    client: httpx.AsyncClient, pg_pool: Pool, pg_schema: str, item: str, n: int, nul: bool,
) -> None:
    """A row the database refuses for its values (SQLSTATE classes 22 and 23: a CHECK, out of
    range, a NUL byte) is the payload's fault: sending it again cannot succeed, so it is
    refused for good (4xx), and the row's values stay out of the answer and the logs."""
    event_id = str(uuid.uuid4())
    body = dumps({"id": "PII-7f3a" + item + "\x00" * nul, "n": n})
    with text_logs("consumerkit", "asyncpg") as lines:
        reply = await client.post("/", content=body, headers=[
            (b"Idempotency-Key", event_id.encode()), (b"X-Event-Type", b"item.saved")])
    answer = check_answer(reply)
    assert 400 <= reply.status_code < 500, f"{reply.status_code} {answer}"
    assert "PII-7f3a" not in reply.text, reply.text[:300]
    check_lines(lines)
    assert not [line for line in lines if "PII-7f3a" in line]
    assert (await items_by_event(pg_pool, pg_schema)).get(event_id) is None
