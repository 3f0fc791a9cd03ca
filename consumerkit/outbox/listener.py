"""LISTEN for a relay behind a transaction pooler, on a direct connection of its own.

Behind PgBouncer in transaction mode a ``LISTEN`` lands on whichever backend serves that one
transaction and hears nothing after it, so such a relay polls. Given a DSN that reaches
PostgreSQL directly (``Postgres(listen_dsn=...)``), it also listens there: a commit to the outbox
wakes it at once, as a direct relay is woken. The connection does nothing else (no lock, no
query), and losing it costs only latency: the relay keeps polling, and connects again at its
next idle wait.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import asyncpg

from ..shared.pooler import connect

log = logging.getLogger("consumerkit.outbox")

_ERRORS = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)


class Listener:
    """A direct connection that calls ``on_notify`` for each notification on ``channel``."""

    def __init__(self, dsn: str, channel: str, *, name: str,
                 on_notify: Callable[[], None]) -> None:
        self._dsn = dsn
        self._channel = channel
        self._name = name
        self._on_notify = on_notify
        self._conn: asyncpg.Connection[asyncpg.Record] | None = None
        self._failed = False  # logged once per outage, not at every idle wait

    @property
    def listening(self) -> bool:
        return self._conn is not None and not self._conn.is_closed()

    async def ensure(self) -> None:
        """Connect and LISTEN unless already listening; a failure is logged, not raised."""
        if self.listening:
            return
        try:
            conn = await connect(self._dsn, pooler="none", timeout=5,
                                 application_name=f"consumerkit-relay-listen {self._name}")
        except _ERRORS as exc:
            if not self._failed:
                log.warning("outbox relay %s cannot LISTEN on its direct connection, polling "
                            "meanwhile: %r", self._name, exc)
            self._failed = True
            return
        try:
            await conn.add_listener(self._channel, self._notified)
        except _ERRORS as exc:
            conn.terminate()
            log.warning("outbox relay %s cannot LISTEN: %r", self._name, exc)
            return
        self._conn = conn
        self._failed = False
        self._on_notify()  # a commit while it was not listening: look once more

    def _notified(self, *_: object) -> None:
        self._on_notify()

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None or conn.is_closed():
            return
        try:
            await conn.close(timeout=5)
        except _ERRORS:
            conn.terminate()
