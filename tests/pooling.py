"""Whether the test session reaches PostgreSQL through a pooler in transaction mode, read once
here from ``CONSUMERKIT_TEST_POSTGRES_POOLER`` (``none``, the default, or ``transaction``).

``scripts/test-pooler.sh`` sets it, with ``CONSUMERKIT_TEST_POSTGRES_DSN`` pointing at a
PgBouncer in transaction mode and ``CONSUMERKIT_TEST_DIRECT_POSTGRES_DSN`` at the server behind
it. The tests' consumers and relays are built with ``postgres_pooler=POOLER``; what a test
itself does on a session (LISTEN, session advisory locks, ``SET``) goes to
``direct_postgres_dsn``; :data:`direct_only` skips a test that is about a direct connection.
"""

from __future__ import annotations

import os

import pytest

from consumerkit.shared.pooler import Pooler

from .harness.pgbouncer import check_pooler

POOLER_ENV = "CONSUMERKIT_TEST_POSTGRES_POOLER"
DIRECT_ENV = "CONSUMERKIT_TEST_DIRECT_POSTGRES_DSN"


def _pooler() -> Pooler:
    value = os.environ.get(POOLER_ENV, "").strip().lower() or "none"
    if value not in ("none", "transaction"):
        raise SystemExit(f"{POOLER_ENV}={value!r}: expected none or transaction")
    return check_pooler(value)


POOLER: Pooler = _pooler()
THROUGH_POOLER = POOLER == "transaction"
# the CLI's spelling of the same setting (``consumerkit migrate/check/run/relay``)
POOLER_FLAG: tuple[str, ...] = ("--postgres-pooler", POOLER) if THROUGH_POOLER else ()


def direct_only(reason: str) -> pytest.MarkDecorator:
    """Skip behind the transaction pooler: the test is about a direct connection (``reason``)."""
    return pytest.mark.skipif(THROUGH_POOLER, reason=f"direct connection only: {reason}")
