"""PgBouncers for the pooler benchmark, and what they count.

The benchmark starts its PgBouncers as the pooler tests do (``tests/harness/pgbouncer.py``: a
configuration in a temporary directory, clients trusted, ``max_prepared_statements = 0``
where the version has it) and reads ``SHOW STATS`` from each one's admin console with
``psql`` (the console speaks the simple query protocol only, which asyncpg does not use for
rows). PgBouncer counts a transaction per server transaction and a query per statement
executed (a simple Query or an Execute; measured: 100 parameterised statements count 100 in
session mode with asyncpg's statement cache on and in transaction mode with it off). The
round trips are not counted: with the statement cache off (``statement_cache_size=0``) a
statement with parameters takes two (Parse and Describe, then Bind and Execute), with it on
one; one without parameters goes as a simple Query, one round trip either way.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from tests.harness.kafka import MissingToolError

if TYPE_CHECKING:
    from tests.harness.pgbouncer import PgBouncer


@dataclass(frozen=True, slots=True)
class Counts:
    """``SHOW STATS`` totals of one PgBouncer database."""

    transactions: int
    statements: int

    def __sub__(self, other: Counts) -> Counts:
        return Counts(self.transactions - other.transactions,
                      self.statements - other.statements)


def missing() -> str | None:
    """Why PgBouncers cannot be started here, else None."""
    from tests.harness.pgbouncer import _binary

    if _binary() is None:
        return "pgbouncer is not installed (apt-get install pgbouncer)"
    if shutil.which("psql") is None:
        return "psql is not installed (apt-get install postgresql-client)"
    return None


def start(dsn: str, mode: str, pool_size: int, prepared_statements: int = 0) -> PgBouncer:
    """A PgBouncer in ``mode`` in front of ``dsn``, started as the pooler tests start theirs
    (``prepared_statements``: its ``max_prepared_statements``, 1.21 and later)."""
    if (reason := missing()) is not None:
        raise MissingToolError(reason)
    from tests.harness.pgbouncer import start_pgbouncer

    return start_pgbouncer(dsn, mode=mode, pool_size=pool_size,
                           prepared_statements=prepared_statements)


def tracks_prepared_statements() -> bool:
    """Whether the PgBouncer used here has ``max_prepared_statements`` (1.21 and later)."""
    from tests.harness.pgbouncer import _binary, _version

    binary = _binary()
    return binary is not None and _version(binary) >= (1, 21)


def version() -> str:
    from tests.harness.pgbouncer import _binary, _version

    binary = _binary()
    return ".".join(map(str, _version(binary))) if binary else "none"


def counts(bouncer_dsn: str) -> Counts:
    """The totals of ``SHOW STATS`` for the database ``bouncer_dsn`` names."""
    parts = urlsplit(bouncer_dsn)
    database = parts.path.lstrip("/")
    out = subprocess.run(
        ["psql", f"host={parts.hostname} port={parts.port} user={parts.username} "
         "dbname=pgbouncer", "-AX", "-F", "\t", "-c", "SHOW STATS"],
        capture_output=True, text=True, timeout=30, check=True).stdout.splitlines()
    header = out[0].split("\t")
    for line in out[1:]:
        row = dict(zip(header, line.split("\t"), strict=False))
        if row.get("database") == database:
            return Counts(int(row["total_xact_count"]), int(row["total_query_count"]))
    return Counts(0, 0)
