"""consumerkit: consume Kafka events exactly once in effect, backed by PostgreSQL."""

from typing import TYPE_CHECKING

from .catalog import EventCatalog, Receives, Sends
from .consumer import Consumer
from .context import BatchContext, HandlerContext
from .deadletter import DeadLetterEntry, DeadLetterTable, DeadLetterTopic
from .deadletter.store import DeadLetterFilter
from .dedup import (
    DedupPolicy,
    InMemoryDedupStore,
    MemoryDedupCache,
    PostgresDedupStore,
    store_for,
)
from .engine.dead_letters import (
    DeadLetterReplayReport,
    discard_dead_letters,
    preview_dead_letters,
    replay_dead_letters,
)
from .envelope import Envelope, Record, WireFormat
from .errors import (
    ConfigurationError,
    ConsumerKitError,
    DeadLetter,
    DeadLetterError,
    DecodeError,
    HandlerDefinitionError,
    HandlerSignal,
    MissingExtraError,
    Retry,
    StartupError,
    TransportError,
    UndeclaredEventError,
    UpcasterChainError,
)
from .migration import migrate
from .outbox import KafkaSink, Outbox, OutboxSink, Relay
from .publishes import Publishes
from .registry import HandlerRegistry, handler
from .retry import RetryPolicy
from .settings.groups import Kafka, Limits, Metrics, Postgres, Stall, Timeouts, Unhandled
from .shared.heap import tune_gc
from .stats import ConsumerStats
from .versions import upcaster
from .webhook import WebhookError, WebhookReceiver

if TYPE_CHECKING:
    from .dedup.redis import RedisDedupCache
    from .outbox.webhook import WebhookSink

__version__ = "0.1.0"

__all__ = [
    # consuming
    "BatchContext",
    "Consumer",
    "ConsumerStats",
    "HandlerContext",
    "HandlerRegistry",
    "Publishes",
    "handler",
    "tune_gc",
    "upcaster",
    # wire format and events
    "EventCatalog",
    "Receives",
    "Sends",
    "Envelope",
    "Record",
    "WireFormat",
    # option groups
    "Kafka",
    "Limits",
    "Metrics",
    "Postgres",
    "Stall",
    "Timeouts",
    "Unhandled",
    # policies
    "DedupPolicy",
    "RetryPolicy",
    # outbox
    "KafkaSink",
    "Outbox",
    "OutboxSink",
    "Relay",
    # storage
    "DeadLetterEntry",
    "DeadLetterTable",
    "DeadLetterTopic",
    "InMemoryDedupStore",
    "MemoryDedupCache",
    "PostgresDedupStore",
    "RedisDedupCache",
    "migrate",
    "store_for",
    # dead letters brought back
    "DeadLetterFilter",
    "DeadLetterReplayReport",
    "discard_dead_letters",
    "preview_dead_letters",
    "replay_dead_letters",
    # webhooks
    "WebhookError",
    "WebhookReceiver",
    "WebhookSink",
    # errors
    "ConfigurationError",
    "ConsumerKitError",
    "DeadLetter",
    "DeadLetterError",
    "DecodeError",
    "HandlerDefinitionError",
    "HandlerSignal",
    "MissingExtraError",
    "Retry",
    "StartupError",
    "TransportError",
    "UndeclaredEventError",
    "UpcasterChainError",
    "__version__",
]


def __getattr__(name: str) -> object:
    if name == "RedisDedupCache":  # needs the optional redis package
        from .dedup import RedisDedupCache

        return RedisDedupCache
    # WebhookSink needs the optional httpx: imported on first use, not with consumerkit
    if name == "WebhookSink":
        try:
            from .outbox.webhook import WebhookSink
        except ImportError as exc:
            raise ImportError(
                f"WebhookSink needs httpx: pip install 'consumerkit[webhook]' ({exc})") from exc
        return WebhookSink
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
