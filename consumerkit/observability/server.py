"""``/metrics``, ``/healthz`` and ``/readyz`` on a small asyncio HTTP/1.1 responder.

``/healthz`` answers 200 while the event loop does; ``/readyz`` 200 when ``readiness()``
returns ``None``, else 503 with the reason as the body; ``/metrics`` the registry in the
Prometheus text format. One request per connection, GET or HEAD only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ..errors import StartupError

log = logging.getLogger("consumerkit.metrics")

Readiness = Callable[[], Awaitable[str | None]]

_REQUEST_TIMEOUT = 10.0
_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


class HealthServer:
    """Serves the endpoints on ``host:port`` until :meth:`close`."""

    def __init__(self, registry: CollectorRegistry, readiness: Readiness, *, host: str,
                 port: int) -> None:
        self.registry = registry
        self.readiness = readiness
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(self._serve, self.host, self.port)
        except OSError as exc:
            raise StartupError(
                f"cannot serve metrics on {self.host}:{self.port}: {exc.strerror or exc}"
            ) from None
        sockets = self._server.sockets
        if sockets and self.port == 0:
            self.port = sockets[0].getsockname()[1]
        log.info("metrics and health on http://%s:%d/metrics", self.host, self.port)

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(_REQUEST_TIMEOUT):
                request = await reader.readuntil(b"\r\n\r\n")
                method, _, rest = request.decode("latin-1").partition(" ")
                path = rest.partition(" ")[0].partition("?")[0]
                status, body, kind = await self._answer(method, path)
                head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {kind}\r\n"
                        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
                writer.write(head.encode() + (b"" if method == "HEAD" else body))
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
                ConnectionError):
            pass  # a client that left or sent nonsense: nothing to answer
        except Exception:
            log.exception("metrics endpoint failed")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, method: str, path: str) -> tuple[int, bytes, str]:
        text = "text/plain; charset=utf-8"
        if method not in ("GET", "HEAD"):
            return 405, b"use GET\n", text
        if path == "/healthz":
            return 200, b"ok\n", text
        if path == "/readyz":
            reason = await self.readiness()
            return (200, b"ready\n", text) if reason is None else (
                503, reason.encode() + b"\n", text)
        if path == "/metrics":
            await self.readiness()  # keeps consumerkit_ready current at each scrape
            return 200, generate_latest(self.registry), CONTENT_TYPE_LATEST
        return 404, b"not found: try /metrics, /healthz or /readyz\n", text
