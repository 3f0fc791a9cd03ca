"""Observing consumers and relays: the observer seam, metrics, health, logs and traces.

:class:`Observer` is the seam (:mod:`.observer`); :class:`~consumerkit.ConsumerStats`,
:class:`ConsumerMetrics` / :class:`RelayMetrics` (Prometheus), :class:`LogObserver` and the
tracing observer (with the ``otel`` extra) subscribe to it. Pass your own with
``Consumer(observers=[...])`` or ``Relay(observers=[...])``.
"""

from .logging import LogObserver, message_fields
from .observer import BaseObserver, Observer, fanout

__all__ = ["BaseObserver", "LogObserver", "Observer", "fanout", "message_fields"]
