"""The webhook sink: each outbox event is one ``POST`` of its JSON payload to an HTTP endpoint.

The answer decides what the relay does with the event:

=================================  ==============================================================
2xx                                delivered (``None``)
408, 429, 5xx, timeout, network    :class:`WebhookError`: retried after the relay's back-off
3xx and every other 4xx            :class:`PermanentSendError`: the event goes to FAILED
=================================  ==============================================================

Redirects are not followed: the request carries credentials, and a redirect means the URL is
out of date. Events of one aggregate are posted one after another, in outbox order; once one
of them fails, the later ones in the batch are not posted and come back as
:class:`BlockedByEarlierEvent`, so the receiver never sees an aggregate's events out of order.

Needs ``httpx``: ``pip install 'consumerkit[webhook]'``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from urllib.parse import urlsplit, urlunsplit
from uuid import UUID

import httpx

from ..display import displayable
from ..errors import ConfigurationError, WebhookError
from ..shared.dsn import redact_dsn
from ..shared.webhook import headers as wh
from ..shared.webhook import signature
from ..shared.webhook.signature import WebhookSecret, secrets_of
from ..shared.webhook.status import judge
from .event import OutboxEvent
from .sink import PermanentSendError

Router = Callable[[OutboxEvent], str]
"""Chooses the URL of each event (by event type, tenant, ...)."""


class BlockedByEarlierEvent(Exception):
    """Not posted: an earlier event of the same aggregate failed in this batch. Retried with
    the events before it, so the aggregate's events still arrive in order."""

    def __init__(self, event_id: UUID, blocker: UUID) -> None:
        super().__init__(f"event {event_id} blocked by earlier event {blocker} of its aggregate")
        self.event_id = event_id
        self.blocker = blocker


class WebhookSink:
    """:class:`~consumerkit.outbox.sink.OutboxSink` posting each event to ``url``.

    ``url`` is one http(s) URL, or a function choosing one per event; it may not carry
    credentials (``user:password@``), since httpx logs request URLs at INFO. ``timeout`` bounds
    one delivery end to end (connect, send, answer), in seconds. ``headers`` are added to every
    request (authorization, say); they are never logged nor shown in errors or ``repr``.
    ``concurrency`` is how many requests may be in flight at once (different aggregates).
    ``secrets`` (one ``whsec_...`` secret or several) sign every request per the Standard
    Webhooks specification (:mod:`consumerkit.shared.webhook.signature`): ``webhook-id`` is the
    event id, ``webhook-timestamp`` the attempt's time, and ``webhook-signature`` holds one
    ``v1`` signature per secret, so a receiver that knows any one of them accepts the request
    (give the new secret and the old one while receivers move over). Secrets are never shown.
    """

    def __init__(
        self, url: str | Router, *, timeout: float = 10.0,
        headers: Mapping[str, str] | None = None, concurrency: int = 8,
        secrets: str | WebhookSecret | Sequence[str | WebhookSecret] | None = None,
    ) -> None:
        if isinstance(url, str):
            fixed = check_url(url)
            self._route: Router = lambda _event: fixed
            self._target = safe_url(fixed)
        elif callable(url):
            self._route = url
            self._target = getattr(url, "__qualname__", "a routing function")
        else:
            raise ConfigurationError(f"url must be a string or a function, got {url!r}")
        if not timeout > 0:
            raise ConfigurationError("timeout must be positive")
        if concurrency < 1:
            raise ConfigurationError("concurrency must be at least 1")
        self.timeout = timeout
        self.concurrency = concurrency
        self._headers = _check_headers(headers or {})
        self._secrets = secrets_of(secrets)
        self._client: httpx.AsyncClient | None = None

    def __repr__(self) -> str:
        names = sorted(self._headers)
        return (f"WebhookSink({self._target}, timeout={self.timeout}, "
                f"concurrency={self.concurrency}, headers={names}, "
                f"signed={len(self._secrets)} secrets)")

    async def open(self) -> None:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=self.timeout, follow_redirects=False,
                limits=httpx.Limits(max_connections=self.concurrency))

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def send(self, events: Sequence[OutboxEvent]) -> list[BaseException | None]:
        """Post every event; one result per event, in order (see the module docstring)."""
        client = self._client
        if client is None:
            raise RuntimeError("WebhookSink.send() called before open()")
        results: list[BaseException | None] = [None] * len(events)
        lanes: dict[tuple[str, str], list[int]] = {}
        for index, event in enumerate(events):
            lanes.setdefault((event.aggregate_type, event.aggregate_id), []).append(index)
        gate = asyncio.Semaphore(self.concurrency)

        async def lane(indexes: list[int]) -> None:
            for position, index in enumerate(indexes):
                async with gate:
                    error = await self._post(client, events[index])
                results[index] = error
                if error is not None:
                    for later in indexes[position + 1:]:
                        results[later] = BlockedByEarlierEvent(
                            events[later].event_id, events[index].event_id)
                    return

        async with asyncio.TaskGroup() as group:
            for indexes in lanes.values():
                group.create_task(lane(indexes))
        return results

    async def _post(self, client: httpx.AsyncClient, event: OutboxEvent) -> BaseException | None:
        try:
            url = check_url(self._route(event))
        except Exception as exc:  # a routing function's bug: retried once it is fixed
            return exc
        try:
            headers = self._request_headers(event)
        except ValueError as exc:
            return PermanentSendError(f"event {event.event_id}: {exc}")
        shown = safe_url(url)
        try:
            async with asyncio.timeout(self.timeout), client.stream(
                    "POST", url, content=event.payload, headers=headers) as response:
                excerpt = "" if response.is_success else await _excerpt(response)
        except (TimeoutError, httpx.TimeoutException) as exc:
            return WebhookError(f"POST {shown} timed out after {self.timeout}s "
                                f"({type(exc).__name__})")
        except httpx.HTTPError as exc:  # connection, protocol or body decoding failures
            detail = displayable(str(exc).replace(url, shown), 300)
            return WebhookError(f"POST {shown} failed: {type(exc).__name__}: {detail}")
        return judge(response.status_code, response.headers.get("retry-after"), excerpt, shown)

    def _request_headers(self, event: OutboxEvent) -> list[tuple[bytes, bytes]]:
        own = [
            ("Content-Type", "application/json"),
            (wh.IDEMPOTENCY_KEY, str(event.event_id)),
            (wh.EVENT_TYPE, event.event_type),
            (wh.OCCURRED_AT, event.occurred_at.isoformat()),
            (wh.AGGREGATE_TYPE, event.aggregate_type),
            (wh.AGGREGATE_ID, event.aggregate_id),
            (wh.ATTEMPT, str(event.attempts + 1)),
        ]
        for name, value in event.headers.items():
            http_name = wh.event_header(name)
            if http_name.lower() not in wh.RESERVED:
                own.append((http_name, value))
        checked = [(name.encode(), _header_value(name, value)) for name, value in own]
        if self._secrets:  # signed last, over the exact bytes sent, at this attempt's time
            signed = signature.sign_headers(self._secrets, str(event.event_id), event.payload)
            checked += [(name.encode(), value.encode()) for name, value in signed.items()]
        return checked + [(name.encode(), value.encode()) for name, value in self._headers.items()]


def check_url(url: str) -> str:
    """``url`` if it is an absolute http or https URL with a host and no user info, else
    :class:`ConfigurationError`."""
    try:
        parts = urlsplit(url) if isinstance(url, str) else None
        host = parts.hostname if parts else None
    except ValueError:
        parts, host = None, None
    if parts is None or parts.scheme not in ("http", "https") or not host:
        raise ConfigurationError(
            f"webhook URL must be an absolute http:// or https:// URL, got {_shown(url)}")
    if "@" in url:  # httpx logs request URLs: credentials belong in headers=; an '@' past
        # the host may end a password holding a raw '/', '?' or '#'
        raise ConfigurationError(
            f"webhook URL {_shown(url)} carries credentials or a raw '@': pass credentials "
            "in headers= instead, and write an '@' of the path or query as %40")
    return url


def safe_url(url: str) -> str:
    """``url`` without credentials, query or fragment: fit for logs and error messages."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _shown(url: object) -> str:
    if not isinstance(url, str):
        return repr(url)
    # no query or fragment (tokens), user info up to the last '@' hidden
    return repr(redact_dsn(url).partition("?")[0].partition("#")[0])


def _check_headers(headers: Mapping[str, str]) -> dict[str, str]:
    checked: dict[str, str] = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not wh.token(name):
            raise ConfigurationError(f"invalid header name {name!r}")
        if name.lower() in wh.RESERVED or name.lower().startswith(wh.PREFIX.lower()):
            raise ConfigurationError(f"header {name!r} is set by the sink itself")
        if not isinstance(value, str) or not value.isprintable() or value != value.strip():
            raise ConfigurationError(f"the value of header {name!r} cannot be sent")  # no value
        checked[name] = value
    return checked


def _header_value(name: str, value: str) -> bytes:
    if not value.isprintable() or value != value.strip():
        raise ValueError(f"the {name} header would not arrive intact "
                         "(control characters or surrounding white space)")
    return value.encode()


async def _excerpt(response: httpx.Response, limit: int = 300) -> str:
    """The start of the answer's body, for the error message; the rest is not read."""
    read = b""
    async for chunk in response.aiter_bytes():
        read += chunk
        if len(read) >= limit:
            break
    return read[:limit].decode(errors="replace")

