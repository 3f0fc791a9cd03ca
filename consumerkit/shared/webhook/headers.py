"""The HTTP headers of a webhook delivery, shared by the sender and the receiver.

A delivery is ``POST <url>`` with the event's JSON payload as the body and these headers:

=============================  ==========================================================
``Idempotency-Key``            the event id; the receiver claims it in its dedup table
``X-Event-Type``               the event type; the receiver routes on it
``X-Event-Occurred-At``        when the event happened (RFC 3339); the dedup window uses it
``X-Event-Aggregate-Type``     the aggregate's type (e.g. ``order``)
``X-Event-Aggregate-Id``       the aggregate's id; events of one aggregate are sent in order
``X-Event-Attempt``            1 on the first delivery, then 2, 3, ... (informative only)
``X-Event-<Name>``             each further outbox header (``correlation_id`` becomes
                               ``X-Event-Correlation-Id``); the outbox writes the event's
                               version as ``event_version``, so it arrives as
                               ``X-Event-Event-Version`` (absent = 1)
=============================  ==========================================================

A sink given secrets adds the Standard Webhooks headers ``webhook-id`` (the event id),
``webhook-timestamp`` and ``webhook-signature`` (see :mod:`consumerkit.webhook.signature`);
when ``webhook-id`` is present the receiver takes it, not ``Idempotency-Key``, as the event id.

Header values are UTF-8. The receiver reads these names through a :class:`WireFormat`, so an
HTTP delivery and a Kafka record go through the same decoding.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ...envelope import WireFormat
from ...errors import DecodeError
from ...versions import read_version

IDEMPOTENCY_KEY = "Idempotency-Key"
EVENT_TYPE = "X-Event-Type"
OCCURRED_AT = "X-Event-Occurred-At"
AGGREGATE_TYPE = "X-Event-Aggregate-Type"
AGGREGATE_ID = "X-Event-Aggregate-Id"
ATTEMPT = "X-Event-Attempt"
PREFIX = "X-Event-"

RESERVED = frozenset(name.lower() for name in (
    IDEMPOTENCY_KEY, EVENT_TYPE, OCCURRED_AT, AGGREGATE_TYPE, AGGREGATE_ID, ATTEMPT,
    "Content-Type", "Content-Length", "Transfer-Encoding", "Host", "Connection",
    "webhook-id", "webhook-timestamp", "webhook-signature",
))
"""Header names the sender sets itself; configured headers may not replace them."""

_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*")


def event_header(name: str) -> str:
    """The HTTP name of an outbox header: ``correlation_id`` -> ``X-Event-Correlation-Id``.

    Raises ``ValueError`` for a name that is no HTTP token once ``_`` becomes ``-``.
    """
    dashed = name.replace("_", "-")
    if not _TOKEN.fullmatch(dashed):
        raise ValueError(f"outbox header {name[:64]!r} cannot be an HTTP header name")
    return PREFIX + "-".join(part.capitalize() for part in dashed.split("-"))


EVENT_VERSION = event_header("event_version")
"""``X-Event-Event-Version``: the outbox's ``event_version`` header, as the sink sends it."""

RECEIVER_WIRE = WireFormat(
    id_header=IDEMPOTENCY_KEY.lower(),
    event_type_header=EVENT_TYPE.lower(),
    occurred_at_header=OCCURRED_AT.lower(),
    aggregate_type_header=AGGREGATE_TYPE.lower(),
    correlation_id_header=event_header("correlation_id").lower(),
    causation_id_header=event_header("causation_id").lower(),
    traceparent_header=event_header("traceparent").lower(),
    event_version_header=EVENT_VERSION.lower(),
)
"""How the receiver reads a delivery: header names as ASGI gives them (lower case)."""


def token(name: str) -> bool:
    """Whether ``name`` is a plain HTTP header name (letters, digits and ``-``)."""
    return bool(_TOKEN.fullmatch(name))


def version_refusal(headers: Mapping[str, bytes]) -> str | None:
    """Why a request's ``X-Event-Event-Version`` (headers by lower-case name) is no version,
    or ``None`` when it is one or is absent (version 1)."""
    try:
        read_version(headers.get(RECEIVER_WIRE.event_version_header), EVENT_VERSION)
    except DecodeError as exc:
        return exc.detail
    return None
