"""How an event id is stored: a canonical UUID in 16 bytes, any other id as it was written.

An id is compared exactly as its producer wrote it. A canonical UUID (lower-case hex in the
8-4-4-4-12 form, what ``str(uuid.UUID(...))`` prints) is stored as a ``uuid``: PostgreSQL
prints it back as the same text, so storing it that way changes no comparison. Any other id,
including a UUID in upper case, in braces or without hyphens, stays text and is a different
id from its canonical form: ``"A0EE...-..."`` and ``"a0ee...-..."`` are two events.
"""

from __future__ import annotations

import re

UUID_SQL_PATTERN = "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
"""The canonical UUID form as a PostgreSQL regular expression (``~`` is case-sensitive)."""

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def is_canonical_uuid(event_id: str) -> bool:
    """Whether ``event_id`` is stored as a ``uuid`` (the same test as the claim function's)."""
    return _UUID.fullmatch(event_id) is not None
