"""An HTTP request as a broker record, so that the receiver decodes it exactly like one."""

from __future__ import annotations

import time

from ..envelope import Record
from ..shared.webhook import headers as wh
from ._asgi import Scope

_FORWARDED = (wh.IDEMPOTENCY_KEY.lower(), wh.PREFIX.lower())  # the event's own headers
_KEY, _WEBHOOK_ID = wh.IDEMPOTENCY_KEY.lower(), "webhook-id"


def as_record(scope: Scope, headers: dict[str, bytes], body: bytes, topic: str) -> Record:
    """The request as a broker record, so that it is decoded exactly like one. The signed
    ``webhook-id``, when present, is the event id: an unsigned ``Idempotency-Key`` could be
    changed on a captured request to slip a replay past the dedup."""
    forwarded = [(name, value) for name, value in headers.items()
                 if name.startswith(_FORWARDED)]
    webhook_id = headers.get(_WEBHOOK_ID)
    if webhook_id is not None:
        forwarded = [(n, v) for n, v in forwarded if n != _KEY] + [(_KEY, webhook_id)]
    return Record(
        topic=topic, partition=-1, offset=-1,
        key=headers.get(wh.AGGREGATE_ID.lower()), value=body, headers=forwarded,
        timestamp=time.time_ns() // 1_000_000)


def attempt_of(headers: dict[str, bytes]) -> int:
    """The delivery attempt the sender numbers (``X-Event-Attempt``), else 1."""
    raw = headers.get(wh.ATTEMPT.lower(), b"")
    return int(raw) if raw.isdigit() and 0 < len(raw) < 10 and int(raw) > 0 else 1
