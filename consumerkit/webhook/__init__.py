"""Webhooks, the receiving side: an ASGI application applying each request through the
consumer's own path. The wire contract it shares with
:class:`~consumerkit.outbox.webhook.WebhookSink`, the sending side, is in
:mod:`consumerkit.shared.webhook`."""

from ..errors import WebhookError
from ..shared.webhook.signature import generate_secret
from .receiver import WebhookReceiver

__all__ = ["WebhookError", "WebhookReceiver", "generate_secret"]
