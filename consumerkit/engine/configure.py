"""The values of a :class:`~consumerkit.Consumer` that its settings may give: which ones its
code chose (passed to the constructor), and checking them and deriving again what depends on
them, one path for the constructor and for ``consumerkit run``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec

from ..dedup.horizon import horizon_findings
from ..errors import ConfigurationError
from ..offsets.store import OFFSET_STORES
from ..shared.identifiers import identifier
from ..shared.pooler import check_pooler
from .unhandled import TypePolicy

if TYPE_CHECKING:
    from ..consumer import Consumer

_P = ParamSpec("_P")
CONFIGURABLE = frozenset({
    "postgres_dsn", "kafka_bootstrap", "schema", "concurrency", "max_batch", "max_in_flight",
    "handler_timeout", "shutdown_timeout", "metrics_port", "metrics_host", "stall_after_keys",
    "stall_max_delay", "offset_store", "unhandled", "ignore", "postgres_pooler"})
"""What :meth:`Consumer.configure` may change (the fields of ``consumerkit run``'s settings)."""


def records_given(
    init: Callable[Concatenate[Consumer, _P], None],
) -> Callable[Concatenate[Consumer, _P], None]:
    """Keep the names of the keyword arguments the code passed (:attr:`Consumer.given`):
    what it chose, told apart from what it left at the default."""

    @functools.wraps(init)
    def wrapper(self: Consumer, /, *args: _P.args, **kwargs: _P.kwargs) -> None:
        init(self, *args, **kwargs)
        self.given = frozenset(kwargs)

    return wrapper


def configure(consumer: Consumer, values: dict[str, Any]) -> None:
    """Set ``values`` on ``consumer``, check them, and derive again what depends on them;
    :class:`ConfigurationError` for a value it refuses (the caller restores the rest)."""
    unknown = set(values) - CONFIGURABLE
    if unknown:
        raise ConfigurationError(f"cannot configure {', '.join(sorted(unknown))}")
    schema = values.pop("schema", None)
    if schema is not None:
        identifier(schema, "schema name")
        consumer.schema = schema
    if "concurrency" in values:
        concurrency = values.pop("concurrency")
        consumer.auto_concurrency = concurrency is None
        if concurrency is not None:
            consumer.concurrency = concurrency
    if "ignore" in values:
        ignore = values.pop("ignore")
        consumer.ignore = (ignore,) if isinstance(ignore, str) else tuple(ignore)
    for name, value in values.items():
        setattr(consumer, name, value)
    consumer.types = TypePolicy.build(consumer.unhandled, consumer.ignore, consumer.routes)
    # batches: a few at once, so they fill while PostgreSQL works; one record per
    # transaction: more at once, so handlers that wait on I/O overlap
    if consumer.auto_concurrency:
        consumer.concurrency = 4 if consumer.max_batch > 1 else 16
    if min(consumer.concurrency, consumer.max_batch, consumer.max_in_flight,
           consumer.max_message_bytes) < 1:
        raise ConfigurationError(
            "concurrency, max_batch, max_in_flight and max_message_bytes must be at least 1")
    if consumer.handler_timeout is not None and consumer.handler_timeout <= 0:
        raise ConfigurationError("handler_timeout must be positive (or None for no limit)")
    if consumer.shutdown_timeout <= 0:
        raise ConfigurationError("shutdown_timeout must be positive")
    if consumer.offset_store not in OFFSET_STORES:
        raise ConfigurationError(f"offset_store must be one of {', '.join(OFFSET_STORES)}, "
                                 f"not {consumer.offset_store!r}")
    try:
        check_pooler(consumer.postgres_pooler)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    if consumer.stall_after_keys < 0 or consumer.stall_max_delay <= 0:
        raise ConfigurationError(
            "stall_after_keys must be at least 0 and stall_max_delay positive")
    # a revocation must end well within the group's rebalance timeout, or the member is
    # thrown out of the group mid-revoke and every partition rebalances again
    consumer.revoke_timeout = min(consumer.shutdown_timeout, consumer.rebalance_timeout / 2)
    for finding in horizon_findings(consumer.dedup, retry=consumer.retry, topic_retention={},
                                    handler_timeout=consumer.handler_timeout):
        if finding.level == "error":
            raise ConfigurationError(finding.message)
