"""Writes a handler queues with ``ctx.defer``, sent together.

A handler that awaits each statement pays a round trip for each. Writes whose result it does
not need can be queued instead: the transaction's queue is sent in the order the writes were
queued, consecutive writes of one query as one ``executemany`` (asyncpg pipelines it: one
round trip for the lot), before anything else runs through ``ctx.tx`` (so a handler reads its
own writes), at the end of a savepoint (``ctx.tx.transaction()``) and before the
transaction's closing check and ``COMMIT``. A savepoint that rolls back drops what was queued
inside it.

``ctx.tx`` is a :class:`FlushingConnection`: the connection itself, except that each of its
statements first sends what is queued. With an empty queue it hands the connection's own
awaitable back, so an awaited statement costs what it cost before.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any

import asyncpg
from asyncpg.connection import _ConnectionProxy
from asyncpg.prepared_stmt import PreparedStatement

from ..errors import ConsumerKitError
from ..types import DbConnection

if TYPE_CHECKING:
    _Proxy = _ConnectionProxy[asyncpg.Record]
else:  # generic in the type stubs only
    _Proxy = _ConnectionProxy


class Deferred:
    """The queued writes of one transaction; ``owner`` says whose they are (the index of the
    handler call that queued them). ``failures`` keeps each error a sent run raised, with its
    owners, so that a failure is charged to whoever queued the write that raised it."""

    __slots__ = ("closed", "conn", "failures", "queue")

    def __init__(self, conn: DbConnection) -> None:
        self.conn = conn
        self.queue: list[tuple[str, tuple[Any, ...], int]] = []
        self.failures: list[tuple[BaseException, frozenset[int]]] = []
        self.closed = False

    def add(self, query: str, args: tuple[Any, ...], owner: int) -> None:
        if not isinstance(query, str):
            raise TypeError(f"ctx.defer takes a query string, got {type(query).__name__}")
        if self.closed:
            raise ConsumerKitError(
                "ctx.defer after the transaction's deferred writes were sent: the write "
                "would be lost (is it called from a task that outlived the handler?)")
        self.queue.append((query, args, owner))

    async def flush(self) -> None:
        """Send the queue, in order: each run of one query with arguments as one
        ``executemany``; a write without arguments alone, with ``execute`` (which also takes
        several statements). If one fails, the transaction (or savepoint) is aborted and the
        rest of the queue is dropped with it."""
        queue, self.queue = self.queue, []
        start = 0
        while start < len(queue):
            query, args, _ = queue[start]
            end = start + 1
            while args and end < len(queue) and queue[end][0] == query and queue[end][1]:
                end += 1
            run = queue[start:end]
            try:
                if len(run) == 1:
                    await self.conn.execute(query, *args)
                else:
                    await self.conn.executemany(query, [each for _, each, _ in run])
            except BaseException as exc:
                self.failures.append((exc, frozenset(owner for _, _, owner in run)))
                raise
            start = end

    def owners(self, exc: BaseException) -> frozenset[int] | None:
        """The handler calls whose deferred write raised ``exc``, or the error ``exc`` was
        raised from; ``None`` if no deferred write did."""
        seen: set[int] = set()
        error: BaseException | None = exc
        while error is not None and id(error) not in seen:
            seen.add(id(error))
            for failed, owners in self.failures:
                if failed is error:
                    return owners
            error = error.__cause__ or error.__context__
        return None


class Immediate(Deferred):
    """The writes of a context built by hand (``HandlerContext(conn, envelope, 1)``): no
    transaction of the consumer sends a queue for it, so a write queued there would be
    silently lost."""

    __slots__ = ()

    def add(self, query: str, args: tuple[Any, ...], owner: int) -> None:
        raise ConsumerKitError(
            "ctx.defer needs a context the consumer made: nothing sends the writes queued on "
            "a HandlerContext built by hand (use await ctx.tx.execute(...) there)")


def _flushing(source: Any, name: str) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(getattr(source, name))
    def call(self: _Flushing, *args: Any, **kwargs: Any) -> Awaitable[Any]:
        method = getattr(self._target, name)
        if not self._deferred.queue:
            return method(*args, **kwargs)  # type: ignore[no-any-return]
        return _after_flush(self._deferred, method, args, kwargs)

    return call


async def _after_flush(deferred: Deferred, method: Callable[..., Awaitable[Any]],
                       args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    await deferred.flush()
    return await method(*args, **kwargs)


class _Flushing:
    __slots__ = ()
    _target: Any
    _deferred: Deferred

    def __getattr__(self, name: str) -> Any:
        if name in ("_target", "_deferred"):  # not set yet (copied, or mid-__init__)
            raise AttributeError(name)
        return getattr(self._target, name)


class FlushingConnection(_Flushing, _Proxy):
    """A connection whose statements first send the transaction's deferred writes. A
    connection proxy to asyncpg, as the pool's connections are: ``isinstance(ctx.tx,
    asyncpg.Connection)`` holds."""

    __slots__ = ("_deferred", "_target")

    def __init__(self, conn: DbConnection, deferred: Deferred) -> None:
        self._target = conn
        self._deferred = deferred

    def __repr__(self) -> str:
        return f"<FlushingConnection {self._target!r}>"

    execute = _flushing(asyncpg.Connection, "execute")
    executemany = _flushing(asyncpg.Connection, "executemany")
    fetch = _flushing(asyncpg.Connection, "fetch")
    fetchrow = _flushing(asyncpg.Connection, "fetchrow")
    fetchval = _flushing(asyncpg.Connection, "fetchval")
    fetchmany = _flushing(asyncpg.Connection, "fetchmany")
    copy_from_query = _flushing(asyncpg.Connection, "copy_from_query")
    copy_from_table = _flushing(asyncpg.Connection, "copy_from_table")
    copy_to_table = _flushing(asyncpg.Connection, "copy_to_table")
    copy_records_to_table = _flushing(asyncpg.Connection, "copy_records_to_table")

    @functools.wraps(asyncpg.Connection.prepare)
    async def prepare(self, *args: Any, **kwargs: Any) -> Any:
        # the statement's own calls send the queue: writes may be queued after preparing
        return _FlushingStatement(self._deferred, await self._target.prepare(*args, **kwargs))

    @functools.wraps(asyncpg.Connection.cursor)
    def cursor(self, *args: Any, **kwargs: Any) -> _FlushingCursor:
        return _FlushingCursor(self._deferred, self._target.cursor(*args, **kwargs))

    @functools.wraps(asyncpg.Connection.transaction)
    def transaction(self, *args: Any, **kwargs: Any) -> _FlushingTransaction:
        return _FlushingTransaction(self._deferred, self._target.transaction(*args, **kwargs))


class _FlushingStatement(_Flushing):
    """``await ctx.tx.prepare(...)``: each of its statements first sends the queue."""

    __slots__ = ("_deferred", "_target")

    def __init__(self, deferred: Deferred, statement: Any) -> None:
        self._deferred = deferred
        self._target = statement

    def __repr__(self) -> str:
        return f"<FlushingStatement {self._target!r}>"

    fetch = _flushing(PreparedStatement, "fetch")
    fetchrow = _flushing(PreparedStatement, "fetchrow")
    fetchval = _flushing(PreparedStatement, "fetchval")
    fetchmany = _flushing(PreparedStatement, "fetchmany")
    executemany = _flushing(PreparedStatement, "executemany")
    explain = _flushing(PreparedStatement, "explain")

    @functools.wraps(PreparedStatement.cursor)
    def cursor(self, *args: Any, **kwargs: Any) -> _FlushingCursor:
        return _FlushingCursor(self._deferred, self._target.cursor(*args, **kwargs))


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
    """``ctx.tx.transaction()`` (a savepoint): the queue is sent before it starts (rolling
    back to it never drops writes queued before it) and before it is released (a write
    queued inside it fails inside it); a rollback drops what was queued inside it."""

    __slots__ = ("_deferred", "_transaction")

    def __init__(self, deferred: Deferred, transaction: Any) -> None:
        self._deferred = deferred
        self._transaction = transaction

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transaction, name)

    async def start(self) -> None:
        await self._deferred.flush()
        await self._transaction.start()

    async def commit(self) -> None:
        await self._deferred.flush()
        await self._transaction.commit()

    async def rollback(self) -> None:
        self._deferred.queue.clear()  # queued since the savepoint began: the start sent
        await self._transaction.rollback()  # everything queued before

    async def __aenter__(self) -> Any:
        await self._deferred.flush()
        return await self._transaction.__aenter__()

    async def __aexit__(self, *exc_info: Any) -> Any:
        if exc_info[0] is None:
            try:
                await self._deferred.flush()
            except BaseException as exc:
                await self._transaction.__aexit__(type(exc), exc, exc.__traceback__)
                raise
        else:
            self._deferred.queue.clear()
        return await self._transaction.__aexit__(*exc_info)
