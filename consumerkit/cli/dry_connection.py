"""The ``ctx.tx`` a handler gets from ``consumerkit check --try-handlers``: statements are
checked by the database, never run.

Each statement is prepared (PostgreSQL parses and plans it: a table, column, schema or
function that does not exist is refused there), then, when it is one ``EXPLAIN`` takes, it is
explained with its parameters as NULL: planning checks the role's privileges on every
relation the statement touches (``permission denied for table ...``) without running it, and
without the read-only check, which only running does. Results are empty (``fetch`` gives
``[]``, ``fetchrow`` and ``fetchval`` give ``None``, ``execute`` a status of 0 rows). A COPY
into a table is checked as an INSERT of its columns. What cannot be checked this way (a COPY
out, cursors, listeners) raises :class:`NotTried`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import asyncpg

from ..errors import ConsumerKitError
from ..types import DbConnection

# what EXPLAIN takes: the statements that plan (a handler's DML and queries)
_EXPLAINABLE = re.compile(r"\s*(\(\s*)*(SELECT|INSERT|UPDATE|DELETE|MERGE|WITH|VALUES|TABLE)\b",
                          re.IGNORECASE)
_VERB = re.compile(r"\s*\(*\s*([A-Za-z]+)")
_WRITES = {"INSERT": "INSERT 0 0", "UPDATE": "UPDATE 0", "DELETE": "DELETE 0",
           "MERGE": "MERGE 0", "SELECT": "SELECT 0", "WITH": "SELECT 0"}


class NotTried(ConsumerKitError):
    """A handler used what the dry connection does not check (COPY, a cursor, ...)."""


class DryConnection:
    """A connection whose statements are prepared and explained, never executed, inside the
    caller's read-only transaction (which the caller rolls back)."""

    def __init__(self, conn: DbConnection) -> None:
        self._conn = conn
        self.checked = 0  # statements the database accepted
        self.refused: asyncpg.PostgresError | None = None  # the first it did not

    def is_in_transaction(self) -> bool:
        return True  # the handler runs inside a transaction, as the consumer runs it

    async def check(self, query: str) -> str:
        """Prepare ``query`` (and explain it); the status ``execute`` would give for 0 rows."""
        if not isinstance(query, str):
            raise TypeError(f"a query string was expected, got {type(query).__name__}")
        try:
            await self._conn.prepare(query)
            if _EXPLAINABLE.match(query):
                explain = await self._conn.prepare(f"EXPLAIN {query}")
                await explain.fetch(*[None] * len(explain.get_parameters()))
        except asyncpg.PostgresError as exc:  # kept: the handler may catch it
            self.refused = self.refused or exc
            raise
        self.checked += 1
        verb = _VERB.match(query)
        word = verb.group(1).upper() if verb else ""
        return _WRITES.get(word, word)

    async def execute(self, query: str, *args: Any, timeout: float | None = None) -> str:
        return await self.check(query)

    async def executemany(self, command: str, args: Any, *,
                          timeout: float | None = None) -> None:
        await self.check(command)

    async def fetch(self, query: str, *args: Any, timeout: float | None = None,
                    record_class: Any = None) -> list[Any]:
        await self.check(query)
        return []

    async def fetchmany(self, query: str, args: Any, *, timeout: float | None = None,
                        record_class: Any = None) -> list[Any]:
        await self.check(query)
        return []

    async def fetchrow(self, query: str, *args: Any, timeout: float | None = None,
                       record_class: Any = None) -> None:
        await self.check(query)

    async def fetchval(self, query: str, *args: Any, column: int = 0,
                       timeout: float | None = None) -> None:
        await self.check(query)

    async def copy_records_to_table(self, table_name: str, *, columns: Sequence[str] | None
                                    = None, schema_name: str | None = None,
                                    **kwargs: Any) -> str:
        return await self._copy_in(table_name, columns, schema_name)

    async def copy_to_table(self, table_name: str, *, columns: Sequence[str] | None = None,
                            schema_name: str | None = None, **kwargs: Any) -> str:
        return await self._copy_in(table_name, columns, schema_name)

    async def _copy_in(self, table: str, columns: Sequence[str] | None,
                       schema: str | None) -> str:
        """A COPY into ``table`` checked as the INSERT of one row of NULLs (or defaults)."""
        target = _quote(table) if schema is None else f"{_quote(schema)}.{_quote(table)}"
        if columns:
            names = ", ".join(_quote(c) for c in columns)
            await self.check(f"INSERT INTO {target} ({names}) VALUES "
                             f"({', '.join('NULL' for _ in columns)})")
        else:
            await self.check(f"INSERT INTO {target} DEFAULT VALUES")
        return "COPY 0"

    async def prepare(self, query: str, *args: Any, **kwargs: Any) -> DryStatement:
        await self.check(query)
        return DryStatement(query)

    def transaction(self, **kwargs: Any) -> Any:
        # a savepoint inside the read-only transaction: rolled back with it in any case
        return self._conn.transaction(**kwargs)

    def __getattr__(self, name: str) -> Any:
        raise NotTried(f"ctx.tx.{name} is not tried (only statements are: execute, fetch, "
                       "fetchrow, fetchval, executemany, prepare, transaction, "
                       "copy_records_to_table, copy_to_table)")


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class DryStatement:
    """What :meth:`DryConnection.prepare` returns: already checked, runs nothing."""

    def __init__(self, query: str) -> None:
        self.query = query

    async def fetch(self, *args: Any, timeout: float | None = None) -> list[Any]:
        return []

    async def fetchrow(self, *args: Any, timeout: float | None = None) -> None:
        return None

    async def fetchval(self, *args: Any, column: int = 0,
                       timeout: float | None = None) -> None:
        return None

    async def fetchmany(self, args: Sequence[Any], *, timeout: float | None = None,
                        ) -> list[Any]:
        return []

    async def executemany(self, args: Any, *, timeout: float | None = None) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        raise NotTried(f"a prepared statement's {name} is not tried")
