"""What :class:`~consumerkit.dedup.redis.RedisDedupCache` sends to Redis: its two Lua scripts
and the one argument that carries a batch's ids to them.

Keys are ``<prefix>:<namespace>:<event id>``; an id longer than 64 characters, empty, with a
newline, or starting with ``sha256:`` is replaced by ``sha256:<hex digest>``. Namespaces are
consumer names, which contain no ``:``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

_HASHED = b"sha256:"
ERROR = b"e"  # the answer for an id whose lookup failed (neither hit nor miss)
_LONGEST_PLAIN_ID = 64

KNOWN = """
local found, n = {}, 0
for id in string.gmatch(ARGV[2], '[^\\n]+') do
    n = n + 1
    found[n] = redis.call('EXISTS', ARGV[1] .. id) == 1 and '1' or '0'
end
return table.concat(found)
"""
REMEMBER = """
local n = 0
for id in string.gmatch(ARGV[3], '[^\\n]+') do
    n = n + 1
    redis.call('SET', ARGV[1] .. id, '1', 'PX', ARGV[2])
end
return n
"""


def _id_part(event_id: str) -> bytes:
    """The id as it appears in its key: itself, or its digest when it is long, empty, holds the
    separator of the scripts' argument, or looks like a digest."""
    raw = event_id.encode("utf-8", "surrogatepass")
    if len(event_id) > _LONGEST_PLAIN_ID or not raw or b"\n" in raw or raw.startswith(_HASHED):
        return _HASHED + hashlib.sha256(raw).hexdigest().encode()
    return raw


def lines(namespace: str, event_ids: Sequence[str]) -> bytes:
    """The ids as the scripts take them: ``namespace:id``, one per line. The usual batch
    (short plain ids) is checked and joined without a Python loop per id."""
    head = namespace + ":"
    text = "\n".join(event_ids)
    lengths = list(map(len, event_ids))
    if (min(lengths) > 0 and max(lengths) <= _LONGEST_PLAIN_ID
            and text.count("\n") == len(event_ids) - 1 and "sha256:" not in text):
        return (head + text.replace("\n", "\n" + head)).encode("utf-8", "surrogatepass")
    prefix = head.encode("utf-8", "surrogatepass")
    return b"\n".join(prefix + _id_part(event_id) for event_id in event_ids)
