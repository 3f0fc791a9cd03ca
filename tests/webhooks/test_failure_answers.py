"""How the receiver answers each way an attempt can fail, without a database: the errors are
the ones asyncpg and the handler raise, the answer is what the ASGI server would be sent."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import asyncpg
import orjson
import pytest

from consumerkit import DeadLetter, Retry
from consumerkit.shared.failures import ClaimBlocked, HandlerFailure
from consumerkit.webhook import _answers as answers


class Unretriable(Exception):
    retriable = False


async def answer(raised: Exception) -> tuple[int, str, dict[str, str]]:
    sent: list[MutableMapping[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    await answers.failed(send, "key-1", raised, retry_after=9)
    start, body = sent
    headers = {n.decode(): v.decode() for n, v in start["headers"]}
    return start["status"], orjson.loads(body["body"])["error"], headers


@pytest.mark.parametrize(("raised", "status", "code", "retry_after"), [
    (ClaimBlocked(asyncpg.LockNotAvailableError("lock timeout")), 503, "in_progress", "9"),
    (ClaimBlocked(asyncpg.CheckViolationError("no partition")), 503, "unavailable", "9"),
    (asyncpg.ConnectionDoesNotExistError("gone"), 503, "unavailable", "9"),
    (asyncpg.CannotConnectNowError("starting up"), 503, "unavailable", "9"),
    (TimeoutError(), 503, "unavailable", "9"),  # no pool connection came free
    (HandlerFailure(asyncpg.AdminShutdownError("shutdown")), 503, "unavailable", "9"),
    (HandlerFailure(Retry(delay=3.4)), 503, "retry", "3"),
    (HandlerFailure(Retry()), 503, "retry", "9"),
    (HandlerFailure(RuntimeError("boom")), 500, "handler_failed", None),
    (HandlerFailure(TimeoutError()), 500, "handler_failed", None),  # past handler_timeout
    (HandlerFailure(DeadLetter("never")), 422, "rejected", None),
    (HandlerFailure(Unretriable("never")), 422, "rejected", None),
    (asyncpg.UndefinedFunctionError("no claim function"), 500, "internal_error", None),
])
async def test_each_failure_gets_its_answer(
    raised: Exception, status: int, code: str, retry_after: str | None,
) -> None:
    got_status, got_code, headers = await answer(raised)
    assert (got_status, got_code) == (status, code)
    assert headers.get("retry-after") == retry_after

