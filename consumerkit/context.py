"""What a handler receives besides its payload."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .envelope import Envelope
    from .types import DbConnection


@dataclass(frozen=True, slots=True)
class HandlerContext:
    """The handler's view of one delivery.

    ``tx`` is the asyncpg connection, already inside the transaction that holds the dedup row:
    everything written through it commits (or rolls back) together with that row.
    """

    tx: DbConnection
    envelope: Envelope
    attempt: int
    log: logging.LoggerAdapter[logging.Logger]
