"""UUID version 7 (RFC 9562): 48 bits of Unix milliseconds, then random bits. Ids made later
sort later (to the millisecond), which keeps the outbox's unique index compact."""

from __future__ import annotations

import os
import time
from uuid import UUID


def uuid7(unix_ms: int | None = None) -> UUID:
    """A new UUIDv7 for ``unix_ms`` (default: now)."""
    ms = time.time_ns() // 1_000_000 if unix_ms is None else unix_ms
    rand = int.from_bytes(os.urandom(10), "big")  # 80 bits, 74 of them used
    value = (ms & 0xFFFF_FFFF_FFFF) << 80
    value |= 0x7 << 76  # version
    value |= ((rand >> 62) & 0xFFF) << 64  # rand_a, 12 bits
    value |= 0b10 << 62  # variant
    value |= rand & 0x3FFF_FFFF_FFFF_FFFF  # rand_b, 62 bits
    return UUID(int=value)
