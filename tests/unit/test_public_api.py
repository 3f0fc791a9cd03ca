"""The public API a user's code touches, listed: a name added to or dropped from a public
module's ``__all__`` fails here until this list says so (as httpx's test_exported_members).
Every error those modules export is in the one tree of :mod:`consumerkit.errors`."""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Mapping

import pytest

import consumerkit.errors

PUBLIC: dict[str, list[str]] = {
    "consumerkit": [
        "BatchContext", "ConfigurationError", "Consumer", "ConsumerKitError",
        "ConsumerStats", "DeadLetter", "DeadLetterEntry", "DeadLetterError",
        "DeadLetterFilter", "DeadLetterReplayReport", "DeadLetterTable",
        "DeadLetterTopic", "DecodeError", "DedupPolicy", "Envelope", "EventCatalog",
        "HandlerContext", "HandlerDefinitionError", "HandlerRegistry", "HandlerSignal",
        "InMemoryDedupStore", "Kafka", "KafkaSink", "Limits", "MemoryDedupCache", "Metrics",
        "MissingExtraError", "Outbox", "OutboxSink", "Postgres",
        "PostgresDedupStore", "Publishes", "Receives", "Record", "RedisDedupCache", "Relay",
        "Retry", "RetryPolicy", "Sends", "Stall", "StartupError", "Timeouts", "TransportError",
        "UndeclaredEventError", "Unhandled", "UpcasterChainError",
        "WebhookError", "WebhookReceiver", "WebhookSink", "WireFormat", "__version__",
        "discard_dead_letters", "handler", "migrate", "preview_dead_letters",
        "replay_dead_letters", "store_for", "tune_gc", "upcaster",
    ],
    "consumerkit.deadletter": [
        "DeadLetterEntry", "DeadLetterTable", "DeadLetterTopic", "list_dead_letters",
    ],
    "consumerkit.dedup": [
        "DedupPolicy", "ExpiredPolicy", "InMemoryDedupStore", "Layout",
        "MaintenanceReport", "MemoryDedupCache", "PartitionInfo", "PostgresDedupStore",
        "RedisDedupCache",
        "list_partitions", "maintain", "store_for",
    ],
    "consumerkit.observability": [
        "BaseObserver", "LogObserver", "Observer", "fanout", "message_fields",
    ],
    "consumerkit.offsets": [
        "KafkaOffsets", "OFFSET_STORES", "OffsetStore", "OffsetStoreName",
        "PostgresOffsets",
    ],
    "consumerkit.outbox": [
        "CdcSetup", "DEFAULT_RETRY", "FailedEvent", "KafkaSink", "NewEvent",
        "NoReplicationSlotError", "NotInTransactionError", "Outbox", "OutboxEvent",
        "OutboxRetention", "OutboxSink", "OutboxTable", "PermanentSendError", "Relay", "SLOTS",
        "TopicRoute", "cleanup", "count_failed", "failed_events", "live_relays",
        "maintain_outbox", "prepare_cdc", "retry_failed", "skip_failed",
        "slot_reading",
    ],
    "consumerkit.parking": [
        "ParkedKey", "ParkedRecord",
    ],
    "consumerkit.settings": [
        "ALIASES", "CONSUMER_GROUPS", "CommonSettings", "ConsumerSettings", "PREFIX",
        "RelaySettings", "SETTINGS", "env_name", "flag", "settings_fields", "value",
    ],
    "consumerkit.settings.groups": [
        "GROUPS", "Group", "Kafka", "Limits", "Metrics", "Postgres", "Stall", "Timeouts",
        "Unhandled",
    ],
    "consumerkit.testing": [
        "FAST_RETRY", "MemoryBroker", "MemorySource", "Outcome", "Settled", "TestConsumer",
    ],
    "consumerkit.testing.services": [
        "EmbeddedPostgres", "MakeTopic", "RedisServer", "ServiceStartError",
        "TansuBroker", "free_port", "require_embedded", "start_postgres", "start_redis",
        "start_tansu",
    ],
    "consumerkit.transport": [
        "KafkaProducer", "KafkaSource", "MemoryBroker", "MemorySource", "Partition",
        "RebalanceHandler", "Source",
    ],
    "consumerkit.webhook": [
        "WebhookError", "WebhookReceiver", "generate_secret",
    ],
}
# Exported errors not yet defined in consumerkit.errors, each waiting on its module's owner.
OUTSIDE_THE_TREE: set[str] = set()


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_exported_members(module: str) -> None:
    imported = importlib.import_module(module)
    exported = sorted(imported.__all__)
    assert exported == PUBLIC[module]
    assert [name for name in exported if not hasattr(imported, name)] == []


def errors_outside_the_tree(modules: Mapping[str, object]) -> list[str]:
    """Exported exception classes (other than signals Python defines) not defined in
    consumerkit.errors under ConsumerKitError."""
    stray = []
    for module, imported in modules.items():
        for name in getattr(imported, "__all__", []):
            value = getattr(imported, name)
            if not (inspect.isclass(value) and issubclass(value, BaseException)):
                continue
            if (value.__module__ != "consumerkit.errors"
                    or not issubclass(value, consumerkit.errors.ConsumerKitError)):
                stray.append(f"{module}.{name}")
    return sorted(stray)


def test_every_exported_error_is_in_the_tree() -> None:
    modules = {m: importlib.import_module(m) for m in PUBLIC}
    assert {s.rsplit(".", 1)[1] for s in errors_outside_the_tree(modules)} == OUTSIDE_THE_TREE


def test_the_tree_in_the_docstring_names_every_error() -> None:
    doc = consumerkit.errors.__doc__ or ""
    defined = [name for name, value in vars(consumerkit.errors).items()
               if inspect.isclass(value) and issubclass(value, BaseException)
               and value.__module__ == "consumerkit.errors"]
    assert [name for name in defined if not re.search(rf"^[ │├└─]*{name}\b", doc, re.M)] == []


def test_the_check_finds_an_error_outside_the_tree() -> None:
    class Stray:
        __all__ = ["OwnError", "ConsumerKitError"]
        OwnError = type("OwnError", (consumerkit.errors.ConsumerKitError,), {})
        ConsumerKitError = consumerkit.errors.ConsumerKitError

    assert errors_outside_the_tree({"stray": Stray}) == ["stray.OwnError"]
