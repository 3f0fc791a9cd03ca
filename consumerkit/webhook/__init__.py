"""Webhooks: the receiving side (an ASGI application) and the header and status contract it
shares with :class:`~consumerkit.outbox.webhook.WebhookSink`, the sending side."""

from .receiver import WebhookReceiver
from .status import WebhookError

__all__ = ["WebhookError", "WebhookReceiver"]
