"""The status code contract between a webhook sender and its receiver.

=================================  ============================================================
2xx                                delivered; the receiver applied the event, now or before
408, 429, 5xx, no answer           try again later (after ``Retry-After`` if the answer has one)
3xx and every other 4xx            refused for good: retrying the same request cannot help
=================================  ============================================================

:class:`~consumerkit.webhook.WebhookReceiver` answers along these lines and
:class:`~consumerkit.outbox.webhook.WebhookSink` reads answers with :func:`judge`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from ...display import displayable
from ...errors import PermanentSendError, WebhookError

RETRIABLE_4XX = frozenset({408, 429})


def retriable(status: int) -> bool:
    """Whether an answer with ``status`` invites the same request again later."""
    return status in RETRIABLE_4XX or status >= 500


def judge(status: int, retry_after_header: str | None, excerpt: str, url: str
          ) -> BaseException | None:
    """The sender's reading of an answer: ``None`` (delivered), a :class:`WebhookError`
    (retry) or a :class:`PermanentSendError` (give up). ``excerpt`` is the start of the body,
    ``url`` the URL as it may be shown (no credentials)."""
    if 200 <= status < 300:
        return None
    text = displayable(" ".join(excerpt.split()), 200)  # the receiver's text, shown later
    detail = f"POST {url} answered {status}" + (f": {text}" if text else "")
    if retriable(status):
        return WebhookError(detail, status=status, retry_after=retry_after(retry_after_header))
    if 300 <= status < 400:
        detail += " (redirects are not followed: configure the final URL)"
    return PermanentSendError(detail)


def retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """A ``Retry-After`` header in seconds: delay-seconds or an HTTP date (``None`` if absent
    or unreadable; a date in the past is 0)."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())
