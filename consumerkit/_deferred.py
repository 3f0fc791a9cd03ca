"""Writes a handler queues with ``ctx.defer``, sent together.

A handler that awaits each statement pays a round trip for each. Writes whose result it does
not need can be queued instead: the transaction's queue is sent in the order the writes were
queued, consecutive writes of one query as one ``executemany`` (asyncpg pipelines it: one
round trip for the lot), before anything else runs through ``ctx.tx`` (so a handler reads its
own writes) and before the transaction's closing check and ``COMMIT``.

``ctx.tx`` is a :class:`FlushingConnection`: the connection itself, except that each of its
statements first sends what is queued. With an empty queue it hands the connection's own
awaitable back, so an awaited statement costs what it cost before.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from typing import Any

from .types import DbConnection


class Deferred:
    """The queued writes of one transaction; ``owner`` says whose they are (the index of the
    handler call that queued them), ``broke`` whose writes failed to apply."""

    __slots__ = ("broke", "conn", "queue")

    def __init__(self, conn: DbConnection) -> None:
        self.conn = conn
        self.queue: list[tuple[str, tuple[Any, ...], int]] = []
        self.broke: set[int] | None = None

    def add(self, query: str, args: tuple[Any, ...], owner: int) -> None:
        if not isinstance(query, str):
            raise TypeError(f"ctx.defer takes a query string, got {type(query).__name__}")
        self.queue.append((query, args, owner))

    async def flush(self) -> None:
        """Send the queue, in order: each run of one query as one ``executemany``. If a run
        fails, the transaction is aborted and the rest of the queue is dropped with it."""
        queue, self.queue = self.queue, []
        start = 0
        while start < len(queue):
            query = queue[start][0]
            end = start + 1
            while end < len(queue) and queue[end][0] == query:
                end += 1
            run = queue[start:end]
            try:
                if len(run) == 1:
                    await self.conn.execute(query, *run[0][1])
                else:
                    await self.conn.executemany(query, [args for _, args, _ in run])
            except BaseException:
                self.broke = {owner for _, _, owner in run}
                raise
            start = end


def _flushing(name: str) -> Callable[..., Awaitable[Any]]:
    def call(self: FlushingConnection, *args: Any, **kwargs: Any) -> Awaitable[Any]:
        method = getattr(self._conn, name)
        if not self._deferred.queue:
            return method(*args, **kwargs)  # type: ignore[no-any-return]
        return self._after_flush(method, args, kwargs)

    call.__name__ = name
    return call


class FlushingConnection:
    """A connection whose statements first send the transaction's deferred writes."""

    __slots__ = ("_conn", "_deferred")

    def __init__(self, conn: DbConnection, deferred: Deferred) -> None:
        self._conn = conn
        self._deferred = deferred

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def __repr__(self) -> str:
        return f"<FlushingConnection {self._conn!r}>"

    async def _after_flush(self, method: Callable[..., Awaitable[Any]], args: tuple[Any, ...],
                           kwargs: dict[str, Any]) -> Any:
        await self._deferred.flush()
        return await method(*args, **kwargs)

    execute = _flushing("execute")
    executemany = _flushing("executemany")
    fetch = _flushing("fetch")
    fetchrow = _flushing("fetchrow")
    fetchval = _flushing("fetchval")
    fetchmany = _flushing("fetchmany")
    prepare = _flushing("prepare")
    copy_from_query = _flushing("copy_from_query")
    copy_from_table = _flushing("copy_from_table")
    copy_to_table = _flushing("copy_to_table")
    copy_records_to_table = _flushing("copy_records_to_table")

    def cursor(self, *args: Any, **kwargs: Any) -> _FlushingCursor:
        return _FlushingCursor(self._deferred, self._conn.cursor(*args, **kwargs))

    def transaction(self, *args: Any, **kwargs: Any) -> _FlushingTransaction:
        return _FlushingTransaction(self._deferred, self._conn.transaction(*args, **kwargs))


class _FlushingCursor:
    """``ctx.tx.cursor(...)``: awaited or iterated once the queue is sent."""

    __slots__ = ("_deferred", "_factory")

    def __init__(self, deferred: Deferred, factory: Any) -> None:
        self._deferred = deferred
        self._factory = factory

    def __await__(self) -> Generator[Any, None, Any]:
        return self._open().__await__()

    async def _open(self) -> Any:
        await self._deferred.flush()
        return await self._factory

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._rows()

    async def _rows(self) -> AsyncIterator[Any]:
        await self._deferred.flush()
        async for row in self._factory:
            yield row


class _FlushingTransaction:
    """``ctx.tx.transaction()`` (a savepoint): the queue is sent before it starts, so that
    rolling back to it never drops writes queued before it."""

    __slots__ = ("_deferred", "_transaction")

    def __init__(self, deferred: Deferred, transaction: Any) -> None:
        self._deferred = deferred
        self._transaction = transaction

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transaction, name)

    async def start(self) -> None:
        await self._deferred.flush()
        await self._transaction.start()

    async def __aenter__(self) -> Any:
        await self._deferred.flush()
        return await self._transaction.__aenter__()

    async def __aexit__(self, *exc_info: Any) -> Any:
        return await self._transaction.__aexit__(*exc_info)
