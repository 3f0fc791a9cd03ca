"""A mark telling whether the transaction that made the claims is still the one open.

A handler that runs ``ROLLBACK`` then ``BEGIN`` on ``ctx.tx`` (or ``COMMIT`` then ``BEGIN``)
leaves a transaction open, so the connection looks as it should; but it is another
transaction, without the claims (rolled back, or committed before the effects that followed).
Right after the claims, :func:`mark` sets a transaction-local setting to a token of its own;
at the end, :func:`still_ours` finds the token there only if no transaction ended in between,
since ending one resets the setting. The check is also the round trip that finds a
transaction a handler left aborted (it raises ``InFailedSQLTransactionError`` then).
"""

from __future__ import annotations

import itertools
import os

from .types import DbConnection

_MARK = "SELECT set_config('consumerkit.xact', $1, true)"
_CHECK = "SELECT current_setting('consumerkit.xact', true) IS NOT DISTINCT FROM $1"
_tokens = itertools.count(1)


async def mark(conn: DbConnection) -> str:
    """Mark the open transaction; returns the token :func:`still_ours` expects."""
    token = f"{os.getpid()}.{next(_tokens)}"
    await conn.execute(_MARK, token)
    return token


async def still_ours(conn: DbConnection, token: str) -> bool:
    """Whether the open transaction is the one :func:`mark` marked with ``token``; raises if
    the transaction is aborted."""
    return bool(await conn.fetchval(_CHECK, token))
