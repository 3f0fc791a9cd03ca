"""The few ASGI pieces the receiver needs: read a bounded body, answer with JSON."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import Any, TypeAlias

import orjson

from ..shared.failures import describe

Scope: TypeAlias = MutableMapping[str, Any]
Message: TypeAlias = MutableMapping[str, Any]
Receive: TypeAlias = Callable[[], Awaitable[Message]]
Send: TypeAlias = Callable[[Message], Awaitable[None]]


class BodyTooLarge(Exception):
    """The request body is longer than the receiver accepts."""


class Disconnected(Exception):
    """The client went away before the whole body arrived."""


def request_headers(scope: Scope) -> dict[str, bytes]:
    """The request's headers by lower-case name (ASGI gives them so); the last of a repeated
    name wins."""
    return {bytes(name).decode("latin-1").lower(): bytes(value)
            for name, value in scope.get("headers", ())}


async def read_body(receive: Receive, headers: Mapping[str, bytes], limit: int) -> bytes:
    """The whole body, or :class:`BodyTooLarge` as soon as it is known to exceed ``limit``
    bytes (from ``Content-Length`` before reading anything, else while reading)."""
    declared = headers.get("content-length", b"").strip()
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Disconnected
        chunk = bytes(message.get("body", b""))
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def respond(
    send: Send, status: int, body: Mapping[str, object],
    headers: Sequence[tuple[str, str]] = (),
) -> None:
    """Send a complete JSON response."""
    content = orjson.dumps(body)
    raw = [(b"content-type", b"application/json"),
           (b"content-length", str(len(content)).encode()),
           *((name.lower().encode(), value.encode()) for name, value in headers)]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": content})


async def lifespan(receive: Receive, send: Send, open: Callable[[], Awaitable[None]],
                   close: Callable[[], Awaitable[None]]) -> None:
    """The ASGI lifespan protocol: ``open`` at startup (its failure, said in one line, fails
    the startup), ``close`` at shutdown."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            try:
                await open()
            except Exception as exc:
                await send({"type": "lifespan.startup.failed", "message": describe(exc)})
                return
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await close()
            await send({"type": "lifespan.shutdown.complete"})
            return
