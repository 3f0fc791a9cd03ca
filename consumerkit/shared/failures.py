"""How a failed attempt is judged: the handler's failure (spends an attempt, may end in the
dead letters) or infrastructure trouble (waited out, never dead-lettered).

Infrastructure trouble is what no record caused: a connection lost or refused, the server
shutting down, and, anywhere down the error's ``__cause__`` chain, a PostgreSQL error of class
53 (insufficient resources: ``out of shared memory`` when the lock table is full, disk full,
too many connections) or a statement cancelled (57014) while the consumer stops."""

from __future__ import annotations

from collections.abc import Iterator

import asyncpg

# defined with the rest of the display of untrusted text; the engine finds them here too
from ..display import DESCRIPTION_LIMIT as DESCRIPTION_LIMIT
from ..display import describe as describe
from ..display import without_detail as without_detail
from ..errors import HandlerSignal


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


_CAUSES = 5  # how far down a chain of ``raise ... from`` to look


def causes(error: BaseException) -> Iterator[BaseException]:
    """``error`` and what it was raised from (``raise ... from``), outermost first."""
    link: BaseException | None = error
    for _ in range(_CAUSES):
        if link is None:
            return
        yield link
        link = link.__cause__


def sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE of a PostgreSQL error, else ``None``."""
    if isinstance(error, asyncpg.PostgresError):
        state = getattr(error, "sqlstate", None)
        return state if isinstance(state, str) else None
    return None


def nobodys(error: BaseException, *, stopping: bool = False) -> bool:
    """Whether ``error`` (or what it was raised from) is a PostgreSQL error no record caused:
    the server out of resources (class 53), or a statement cancelled (57014) while
    ``stopping``. A handler's own signal (``DeadLetter(...) from ...``) is its decision."""
    if isinstance(error, HandlerSignal):
        return False
    for link in causes(error):
        state = sqlstate(link)
        if state is not None and (state.startswith("53") or (stopping and state == "57014")):
            return True
    return False


def judge(raised: Exception, *, stopping: bool = False) -> tuple[BaseException, bool]:
    """The error to report, and whether it is an outage rather than the handler's failure;
    ``stopping``: the attempt was abandoned (shutdown, revoked partition), so a statement
    cancelled under it is no one's fault."""
    if isinstance(raised, ConnectionLost | ClaimBlocked):
        return raised.cause, True
    if isinstance(raised, HandlerFailure):
        cause = raised.cause
        return cause, isinstance(cause, _OUTAGES) or nobodys(cause, stopping=stopping)
    # before the handler (acquiring a connection, BEGIN, the claim) a client-side error means
    # the connection broke: asyncpg reports a backend terminated while idle in the pool as an
    # InternalClientError on the next statement. (Errors after the handler ran arrive wrapped
    # in HandlerFailure, see Pipeline._transaction.)
    return raised, (isinstance(raised, (*_OUTAGES, *BROKEN_CONNECTION))
                    or nobodys(raised, stopping=stopping))


def connection_lost(conn: object) -> bool:
    """Whether ``conn`` died under us (asyncpg refuses even to answer once it is gone)."""
    try:
        return bool(conn.is_closed())  # type: ignore[attr-defined]
    except asyncpg.InterfaceError:
        return True
