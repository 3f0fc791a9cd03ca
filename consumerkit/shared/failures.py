"""How a failed attempt is judged: the handler's failure (spends an attempt, may end in the
dead letters) or infrastructure trouble (waited out, never dead-lettered)."""

from __future__ import annotations

import asyncpg

# defined with the rest of the display of untrusted text; the engine finds them here too
from ..display import DESCRIPTION_LIMIT as DESCRIPTION_LIMIT
from ..display import describe as describe
from ..display import without_detail as without_detail


class HandlerFailure(Exception):
    """Carries an exception raised by the handler itself (as opposed to the dedup claim, the
    connection or the commit) out of the transaction."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class ClaimBlocked(HandlerFailure):
    """The dedup claim could not run: no partition for now (maintenance will add it), or the
    claim lock stayed taken past its timeout (a stalled consumer still holds the event)."""


class ConnectionLost(HandlerFailure):
    """The connection was closed while the attempt ran (terminated, network, server crash);
    ``during_handler`` when it died under the handler's own statements."""

    def __init__(self, cause: BaseException, *, during_handler: bool) -> None:
        super().__init__(cause)
        self.during_handler = during_handler


class HandlerEndedTransaction(Exception):
    """The handler ran COMMIT or ROLLBACK on ``ctx.tx`` itself."""

    retriable = False


class TransactionReplaced(Exception):
    """A handler of a batch ended the batch's transaction and began another: the batch rolls
    back and its records are applied one by one, where the culprit is found."""


_OUTAGES = (
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.TooManyConnectionsError,
)


# a connection that broke under us, as asyncpg reports it (the consumer and the relay alike);
# InternalClientError: a connection left mid-operation by a backend that died under it
BROKEN_CONNECTION = (OSError, asyncpg.InterfaceError, asyncpg.InternalClientError)


def judge(raised: Exception) -> tuple[BaseException, bool]:
    """The error to report, and whether it is an outage rather than the handler's failure."""
    if isinstance(raised, ConnectionLost | ClaimBlocked):
        return raised.cause, True
    if isinstance(raised, HandlerFailure):
        return raised.cause, isinstance(raised.cause, _OUTAGES)
    # before the handler (acquiring a connection, BEGIN, the claim) a client-side error means
    # the connection broke: asyncpg reports a backend terminated while idle in the pool as an
    # InternalClientError on the next statement. (Errors after the handler ran arrive wrapped
    # in HandlerFailure, see Pipeline._transaction.)
    return raised, isinstance(raised, (*_OUTAGES, *BROKEN_CONNECTION))


def connection_lost(conn: object) -> bool:
    """Whether ``conn`` died under us (asyncpg refuses even to answer once it is gone)."""
    try:
        return bool(conn.is_closed())  # type: ignore[attr-defined]
    except asyncpg.InterfaceError:
        return True
