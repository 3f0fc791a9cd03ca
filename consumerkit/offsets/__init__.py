"""Offsets in one place: where each owned partition stands, where it is kept, and where a new
ownership starts reading.

Imports go one way, from the bottom up::

    watermark, skipped,      what is done in a partition; offsets the client skipped for a
    sighting                 reason (transaction markers); what a fetch with a gap showed
    state                    one owned partition (its watermark, its work in flight)
    store, postgres          the OffsetStore seam: the broker's offsets, a table beside the effects
    gaps, recheck            reading a gap again; offsets written with the effects, and the
                             check that the database did not move back
    tracker                  commits the watermarks to the stores, and places new ownerships

The engine (:mod:`consumerkit.engine.runner`) and the applier use this package; nothing here imports
them.
"""

from __future__ import annotations

from .postgres import PostgresOffsets
from .store import OFFSET_STORES, KafkaOffsets, OffsetStore, OffsetStoreName

__all__ = ["OFFSET_STORES", "KafkaOffsets", "OffsetStore", "OffsetStoreName", "PostgresOffsets"]
