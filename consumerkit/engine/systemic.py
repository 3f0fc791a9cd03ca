"""Whose fault a failed attempt is, by the outermost link of its ``__cause__`` chain that says
(:func:`fault`): every record's (*systemic*) for a SQLSTATE of the database's shape or rights
(:data:`SYSTEMIC`: a missing table, column or schema, a privilege the role lacks, a read-only
transaction) or an exception marked ``systemic = True`` (:mod:`consumerkit.errors`); the
record's own for PostgreSQL's data and integrity errors (:data:`RECORD_FAULTS`, classes 22
and 23) or ``systemic = False``. When none says, a streak of failures decides
(:mod:`~consumerkit.engine.stall`).
"""

from __future__ import annotations

import asyncpg

from ..errors import marked_systemic
from ..shared.failures import causes, sqlstate

SYSTEMIC: dict[str, str] = {
    "42P01": "undefined_table",
    "42703": "undefined_column",
    "3F000": "invalid_schema_name",
    "42501": "insufficient_privilege",
    "25006": "read_only_sql_transaction",
}
"""The SQLSTATEs that every record would hit: the database's shape or rights, not the data."""

RECORD_FAULTS: dict[str, str] = {"22": "data_exception", "23": "integrity_constraint_violation"}
"""The SQLSTATE classes that are the record's own fault: its data, whatever else holds."""


def systemic(error: BaseException) -> str | None:
    """The SQLSTATE condition name when ``error`` (or what it was raised from) is a
    PostgreSQL error every record would hit, else ``None``."""
    cause = systemic_cause(error)
    return None if cause is None else SYSTEMIC[cause.sqlstate]


def systemic_cause(error: BaseException) -> asyncpg.PostgresError | None:
    """``error``, or the error it was raised from, that every record would hit."""
    for link in causes(error):
        if isinstance(link, asyncpg.PostgresError) and sqlstate(link) in SYSTEMIC:
            return link
    return None


def fault(error: BaseException) -> tuple[bool, BaseException] | None:
    """Whose fault ``error`` is, by the outermost link of its cause chain that says:
    ``(True, link)`` every record would hit it, ``(False, link)`` the record's own; ``None``
    when none says (a streak decides)."""
    for link in causes(error):
        if (marked := marked_systemic(link)) is not None:
            return marked, link
        state = sqlstate(link)
        if state in SYSTEMIC or _no_partition(link, state):
            return True, link
        if state is not None and state[:2] in RECORD_FAULTS:
            return False, link
    return None


def _no_partition(link: BaseException, state: str | None) -> bool:
    """A row no partition takes (a time-partitioned outbox whose maintenance lags):
    PostgreSQL reports it as a check violation (23514), but every record would hit it."""
    return state == "23514" and str(link).startswith("no partition of relation")
