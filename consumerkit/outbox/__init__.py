"""The transactional outbox: write events in your transaction, publish them with a relay.

Writer: :class:`Outbox` (``add``, ``add_many``). Relay: :class:`Relay` with a sink,
:class:`KafkaSink` or your own :class:`OutboxSink`. Tables: :class:`OutboxTable`, created by
:func:`consumerkit.migrate` (``outboxes=``) or ``consumerkit migrate``.
Operations: :func:`failed_events`, :func:`count_failed`, :func:`retry_failed`,
:func:`skip_failed`, :func:`cleanup`, :func:`live_relays`. For change data capture, an outbox
kept for a retention in time partitions: :class:`OutboxRetention`, :func:`maintain_outbox`;
its publication and replication slot, made before the first event: :func:`prepare_cdc`.
"""

from ..errors import NoReplicationSlotError, NotInTransactionError, PermanentSendError
from .admin import (
    FailedEvent,
    cleanup,
    count_failed,
    failed_events,
    live_relays,
    maintain_outbox,
    retry_failed,
    skip_failed,
)
from .cdc import CdcSetup, prepare_cdc, slot_reading
from .event import OutboxEvent
from .kafka import KafkaSink
from .relay import DEFAULT_RETRY, Relay
from .retention import OutboxRetention
from .routing import TopicRoute
from .sink import OutboxSink
from .table import SLOTS, OutboxTable
from .writer import NewEvent, Outbox

__all__ = [
    "DEFAULT_RETRY",
    "SLOTS",
    "CdcSetup",
    "FailedEvent",
    "KafkaSink",
    "NewEvent",
    "NoReplicationSlotError",
    "NotInTransactionError",
    "Outbox",
    "OutboxEvent",
    "OutboxRetention",
    "OutboxSink",
    "OutboxTable",
    "PermanentSendError",
    "Relay",
    "TopicRoute",
    "cleanup",
    "count_failed",
    "failed_events",
    "live_relays",
    "maintain_outbox",
    "prepare_cdc",
    "retry_failed",
    "skip_failed",
    "slot_reading",
]
