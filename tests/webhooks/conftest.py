"""Real HTTP servers for the webhook tests: any ASGI app under uvicorn on a free localhost port,
and a scripted endpoint that answers each request as a test tells it to."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

import pytest
import uvicorn

from consumerkit.webhook._asgi import Receive, Scope, Send

STARTUP_TIMEOUT = 10.0
Lifespan: TypeAlias = Literal["auto", "on", "off"]


@contextlib.asynccontextmanager
async def serve(app: Callable[..., Any], *, lifespan: Lifespan = "on") -> AsyncIterator[str]:
    """Run ``app`` under uvicorn on 127.0.0.1 (a port the OS picks); yield its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, lifespan=lifespan, log_level="warning", access_log=False,
                            ws="none", http="h11", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(STARTUP_TIMEOUT):
            while not server.started:
                if task.done():
                    task.result()  # re-raise why it stopped
                    raise RuntimeError("uvicorn stopped before it started (lifespan failed?)")
                await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=15)
        sock.close()


@dataclass
class Reply:
    """How the endpoint answers one request: a status and headers, after ``gate`` opens if
    given; ``hang`` never answers (until the test ends)."""

    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    gate: asyncio.Event | None = None
    hang: bool = False


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    raw_headers: list[tuple[bytes, bytes]]
    body: bytes

    @property
    def key(self) -> str:
        return self.headers["idempotency-key"]


@dataclass
class ScriptedEndpoint:
    """An ASGI app that records every request and answers from a script: first the replies
    queued for the request's Idempotency-Key, then the general queue, else 200."""

    replies: deque[Reply] = field(default_factory=deque)
    by_key: dict[str, deque[Reply]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    answered: list[str] = field(default_factory=list)  # keys, in the order answered
    in_flight: int = 0
    max_in_flight: int = 0
    released: asyncio.Event = field(default_factory=asyncio.Event)
    _arrivals: dict[str, asyncio.Event] = field(default_factory=dict)

    def script(self, key: str, *replies: Reply) -> None:
        self.by_key.setdefault(key, deque()).extend(replies)

    def arrival(self, key: str) -> asyncio.Event:
        """Set once a request with ``key`` has arrived."""
        return self._arrivals.setdefault(key, asyncio.Event())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        raw = [(bytes(n), bytes(v)) for n, v in scope["headers"]]
        request = Request(scope["path"], {n.decode(): v.decode() for n, v in raw}, raw, body)
        self.requests.append(request)
        key = request.headers.get("idempotency-key", "")
        queued = self.by_key.get(key)
        reply = queued.popleft() if queued else (
            self.replies.popleft() if self.replies else Reply())
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.arrival(key).set()
        try:
            if reply.hang:
                await self.released.wait()
                return
            if reply.gate is not None:
                await reply.gate.wait()
        finally:
            self.in_flight -= 1
        self.answered.append(key)
        headers = [(n.lower().encode(), v.encode()) for n, v in reply.headers]
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await send({"type": "http.response.body", "body": reply.body})


@pytest.fixture
async def endpoint() -> AsyncIterator[tuple[ScriptedEndpoint, str]]:
    """A scripted endpoint served on a free port, and its base URL."""
    app = ScriptedEndpoint()
    try:
        async with serve(app, lifespan="off") as url:
            yield app, url
            app.released.set()
    finally:
        app.released.set()


async def wait_until(check: Callable[[], Any], what: str, timeout: float = 30.0) -> None:
    """Poll the coroutine function ``check`` every 20 ms until it returns something truthy;
    fail with ``what`` after ``timeout`` seconds."""
    try:
        async with asyncio.timeout(timeout):
            while not await check():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}") from None
