"""A mark telling whether the transaction that made the claims is still the one open.

A handler that runs ``ROLLBACK`` then ``BEGIN`` on ``ctx.tx`` leaves a transaction open, so the
connection looks as it should; but it is another transaction, and the claims are gone with the
first. Right after the claims, :func:`mark` sets two settings to a token of its own: one local
to the transaction, which any end of the transaction resets, and one of the session, which a
``ROLLBACK`` resets and a ``COMMIT`` keeps. At the end, :func:`check` reads both, in the round
trip that also finds a transaction a handler left aborted (it raises
``InFailedSQLTransactionError`` then):

- both there: the marked transaction is still open;
- neither: it was rolled back (``ROLLBACK`` then ``BEGIN``), claims and all;
- only the session's: it was committed (``COMMIT`` then ``BEGIN``), claims included, and the
  open transaction holds what the handlers wrote after.

Tokens are unique in the process, so a value left on a pooled connection never matches.
"""

from __future__ import annotations

import itertools
import logging
import os
from enum import Enum

from ..types import DbConnection

_MARK = ("SELECT set_config('consumerkit.xact', $1, true),"
         " set_config('consumerkit.claimed', $1, false)")
_CHECK = ("SELECT current_setting('consumerkit.xact', true) IS NOT DISTINCT FROM $1,"
          " current_setting('consumerkit.claimed', true) IS NOT DISTINCT FROM $1")
_tokens = itertools.count(1)


class Mark(Enum):
    OURS = "ours"  # the marked transaction is still open
    ROLLED_BACK = "rolled back"  # ended by ROLLBACK, another one begun
    COMMITTED = "committed"  # ended by COMMIT, another one begun


async def mark(conn: DbConnection) -> str:
    """Mark the open transaction; returns the token :func:`check` expects."""
    token = f"{os.getpid()}.{next(_tokens)}"
    await conn.execute(_MARK, token)
    return token


async def check(conn: DbConnection, token: str) -> Mark:
    """What became of the transaction :func:`mark` marked with ``token``; raises if the open
    transaction is aborted."""
    row = await conn.fetchrow(_CHECK, token)
    assert row is not None
    if row[0]:
        return Mark.OURS
    return Mark.COMMITTED if row[1] else Mark.ROLLED_BACK


async def verify(conn: DbConnection, token: str, *, what: str,
                 log: logging.Logger | logging.LoggerAdapter[logging.Logger],
                 rolled_back: Exception) -> None:
    """Raise ``rolled_back`` if the marked transaction was rolled back and another begun. One
    committed and another begun committed the claims with the effects so far, and the open
    transaction holds the rest: it is to be committed too, and the misuse is logged."""
    outcome = await check(conn, token)
    if outcome is Mark.ROLLED_BACK:
        raise rolled_back
    if outcome is Mark.COMMITTED:
        log.error("a handler committed the transaction of %s itself and began another: its "
                  "claims and effects were committed in two transactions", what)
