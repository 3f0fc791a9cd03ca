"""A fresh PostgreSQL primary with a streaming standby for each failover test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness import ReplicatedPostgres, start_replicated_postgres


@pytest.fixture
def pair() -> Iterator[ReplicatedPostgres]:
    """A primary and its standby, streaming; both stopped (by pid) and deleted after."""
    with start_replicated_postgres() as replicated:
        yield replicated
