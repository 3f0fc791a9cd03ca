"""A real PgBouncer in front of the tests' PostgreSQL.

``pgbouncer`` starts one (a configuration in a temporary directory, a free port on 127.0.0.1,
clients trusted, the server reached as the tests' DSN says) and stops it after the test;
``pool_mode = transaction`` by default, with ``max_prepared_statements = 0`` where the version
knows that setting (1.21 and later), so that it behaves as PgBouncer before 1.21 does: a
client's prepared statements reach whichever backend serves its transaction. Without a
``pgbouncer`` binary the tests that use it skip, saying what to install.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.harness.kafka_jars import MissingToolError
from tests.harness.pgbouncer import BINARY_ENV, PgBouncer, start_pgbouncer

__all__ = ["BINARY_ENV", "PgBouncer", "start_pgbouncer"]


@pytest.fixture
def pgbouncer(direct_postgres_dsn: str) -> Iterator[Callable[..., PgBouncer]]:
    """Start PgBouncers in front of the tests' PostgreSQL (``mode``, ``pool_size``,
    ``prepared_statements``), never in front of the session's own pooler; all are stopped
    after the test."""
    started: list[PgBouncer] = []

    def start(mode: str = "transaction", pool_size: int = 8,
              prepared_statements: int = 0) -> PgBouncer:
        try:
            bouncer = start_pgbouncer(direct_postgres_dsn, mode=mode, pool_size=pool_size,
                                      prepared_statements=prepared_statements)
        except MissingToolError as exc:
            pytest.skip(str(exc))
        started.append(bouncer)
        return bouncer

    yield start
    for bouncer in started:
        bouncer.stop()


# the fixtures of the suites whose scenarios run here through PgBouncer
from ..integration.conftest import ledger_topic  # noqa: E402, F401
from ..outbox.conftest import outbox, outbox_table  # noqa: E402, F401
from ..parking.conftest import park_topic  # noqa: E402, F401
