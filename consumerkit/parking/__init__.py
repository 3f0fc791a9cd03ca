"""Parked keys: a record whose handler cannot apply it holds back its key.

With ``on_exhausted="park"`` (on ``@handler`` or the :class:`~consumerkit.RetryPolicy`) a
record whose retries ran out is parked instead of dead-lettered, and so is every later record
of its key on that partition, in order, while other keys flow and the offsets move on.
``consumerkit parked replay`` applies them, in order and once, after a fix; ``discard`` drops
them with an audit row. :mod:`.tables` holds the DDL, :mod:`.store` the SQL, :mod:`.lot` the
consumer's in-memory view, :mod:`.replay` the commands' side.
"""

from .entry import ParkedKey, ParkedRecord

__all__ = ["ParkedKey", "ParkedRecord"]
