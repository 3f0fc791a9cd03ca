"""One delivery (a ``POST``), from the request to the answer, top to bottom.

The method; the body, refused with 413 when larger than ``max_body_bytes``; the signature
before anything reads the body (401); the Standard Webhooks version (400); the decoding into
an event (404 no handler, 413 too large, 400 otherwise; a signed request refused for good
spends its id: :mod:`._refusals`); then the claim and the handler in one transaction
(:mod:`._apply`) and the answer (:mod:`._answers`).
:class:`~consumerkit.webhook.WebhookReceiver` builds one :class:`Deliveries` and hands it
each request with its pool.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import asyncpg

from ..dedup.policy import ExpiredPolicy
from ..dedup.postgres import PostgresDedupStore
from ..engine.apply import Applier
from ..engine.decode import Decoded, Decoder
from ..envelope import Record
from ..errors import DecodeError
from ..observability.logging import message_fields
from ..observability.observer import Observer
from ..route_table import RouteTable
from ..shared.webhook import headers as wh
from ..shared.webhook.signature import WebhookSecret, verify
from . import _answers as answers
from ._apply import apply, report
from ._asgi import BodyTooLarge, Disconnected, Receive, Scope, Send, read_body, request_headers
from ._refusals import claim_refused
from ._request import as_record, attempt_of

log = logging.getLogger("consumerkit.webhook")

_ACQUIRE_TIMEOUT = 10.0  # seconds a request waits for a pool connection before a 503
_STATUS_OF_REASON = {"oversized": 413, "unknown_event_type": 404}  # other reasons: 400


@dataclass(frozen=True, slots=True, kw_only=True)
class Deliveries:
    """What every delivery to one receiver goes through."""

    namespace: str
    routes: RouteTable
    secrets: tuple[WebhookSecret, ...]
    tolerance: float
    max_body_bytes: int
    retry_after: int
    expired: ExpiredPolicy
    decoder: Decoder
    store: PostgresDedupStore
    applier: Applier
    observe: Observer

    async def serve(self, scope: Scope, receive: Receive, send: Send,
                    pool: asyncpg.Pool | None) -> None:
        """Answer one HTTP request; ``pool`` is ``None`` while the receiver is not open."""
        if scope["method"] != "POST":
            await answers.refuse(send, 405, "method_not_allowed", "use POST",
                                 [("Allow", "POST")])
            return
        if pool is None:
            await answers.unavailable(send, "not_started", "the receiver is not open yet",
                                      self.retry_after)
            return
        headers = request_headers(scope)
        try:
            body = await read_body(receive, headers, self.max_body_bytes)
        except BodyTooLarge:
            await answers.refuse(send, 413, "oversized",
                                 f"the body exceeds {self.max_body_bytes} bytes")
            return
        except Disconnected:
            return
        if self.secrets:  # before anything reads the body: nothing unverified is parsed
            rejected = verify(self.secrets, headers, body, tolerance=self.tolerance)
            if rejected is not None:
                log.warning("refused a webhook request to %r: %s", scope.get("path", "/"),
                            rejected.code)
                await answers.refuse(send, 401, rejected.code, rejected.detail)
                return
        version = wh.version_refusal(headers)
        if version is not None:  # the sender's mistake, not a replay risk: the id stays unspent
            await answers.refuse(send, 400, "invalid_version", version)
            return
        record = as_record(scope, headers, body, self._topic(scope))
        try:
            decoded = self.decoder.decode(record)
        except DecodeError as exc:
            # a signed request refused for good spends its id: see _refusals
            if self.secrets and not await claim_refused(
                    pool, self.store, self.namespace, record, exc.reason):
                await answers.unavailable(send, "unavailable", "the database is unavailable",
                                          self.retry_after)
                return
            status = _STATUS_OF_REASON.get(exc.reason, 400)
            await answers.refuse(send, status, exc.reason, exc.detail)
            return
        await self._apply(send, pool, record, decoded, attempt_of(headers))

    def _topic(self, scope: Scope) -> str:
        """``webhook:<path>`` for a path a handler routes on, else ``webhook:<namespace>``:
        the path is the caller's choice, and as a metric label it must stay bounded."""
        topic = f"webhook:{scope.get('path', '/')}"
        return topic if topic in self.routes.by_topic else f"webhook:{self.namespace}"

    async def _apply(self, send: Send, pool: asyncpg.Pool, record: Record, decoded: Decoded,
                     attempt: int) -> None:
        key = decoded.envelope.event_id
        self.observe.delivered(1)
        try:
            claim = await apply(pool, self.applier, decoded, attempt,
                                acquire_timeout=_ACQUIRE_TIMEOUT)
        except Exception as exc:
            if self.secrets and answers.rejected(exc):  # spends the id: see _refusals
                await claim_refused(pool, self.store, self.namespace, record, "rejected")
            await answers.failed(send, key, exc, self.retry_after, message_fields(
                record, decoded.envelope, handler=decoded.route.name, attempt=attempt,
                consumer=self.namespace))
            return
        report(self.observe, record, decoded, claim, self.expired)
        await answers.settled(send, key, claim, self.expired)
