"""pytest fixtures for teams testing code built on consumerkit (loaded by the ``pytest11``
entry point: installing consumerkit is the whole setup).

Services, each started on first use and stopped when the session ends:

- ``consumerkit_postgres_dsn`` (session): ``$CONSUMERKIT_TEST_POSTGRES_DSN`` if set, else an
  embedded PostgreSQL (the ``embedded`` extra).
- ``consumerkit_kafka_bootstrap`` (session): ``$CONSUMERKIT_TEST_KAFKA_BOOTSTRAP`` if set,
  else a Tansu broker (the ``embedded`` extra).

Per test:

- ``consumerkit_schema``: a fresh schema on that PostgreSQL, dropped after the test.
- ``consumerkit_dsn``: the server's DSN with ``search_path`` set to that schema, so tables the
  code under test creates and uses unqualified land in it.
- ``consumerkit_topic``: ``consumerkit_topic(partitions=1)`` creates a uniquely named topic
  on the broker and returns its name.

Fixtures are synchronous (they work under any async test runner); names start with
``consumerkit_`` so they never clash with a project's own.
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Protocol, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg
import pytest

from ..shared.identifiers import redact_dsn
from ..transport.kafka_admin import create_topic
from .services import start_postgres, start_tansu

POSTGRES_ENV = "CONSUMERKIT_TEST_POSTGRES_DSN"
KAFKA_ENV = "CONSUMERKIT_TEST_KAFKA_BOOTSTRAP"

_T = TypeVar("_T")


class NewTopic(Protocol):
    """The type of the ``consumerkit_topic`` fixture."""

    def __call__(self, partitions: int = 1) -> str: ...


def _run(make: Callable[[], Awaitable[_T]]) -> _T:
    """Run a coroutine to completion from synchronous fixture code, in a thread of its own
    (the test's event loop may be running in this one)."""
    result: list[_T] = []
    error: list[BaseException] = []

    def target() -> None:
        async def main() -> _T:
            return await make()

        try:
            result.append(asyncio.run(main()))
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=target, name="consumerkit-fixture")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


async def _execute(dsn: str, sql: str) -> None:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        await conn.execute(sql, timeout=30)
    finally:
        await conn.close(timeout=10)


def with_search_path(dsn: str, schema: str) -> str:
    """``dsn`` whose connections use ``schema`` first (asyncpg passes unknown query
    parameters on as server settings)."""
    parts = urlsplit(dsn)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "search_path"]
    query.append(("search_path", f"{schema},public"))
    return urlunsplit(parts._replace(query=urlencode(query)))


@pytest.fixture(scope="session")
def consumerkit_postgres_dsn() -> Iterator[str]:
    """A PostgreSQL server: ``$CONSUMERKIT_TEST_POSTGRES_DSN``, else an embedded one."""
    dsn = os.environ.get(POSTGRES_ENV)
    if dsn:
        yield dsn
        return
    with start_postgres() as server:
        yield server.dsn


@pytest.fixture
def consumerkit_schema(consumerkit_postgres_dsn: str) -> Iterator[str]:
    """A fresh, empty schema on ``consumerkit_postgres_dsn``; dropped after the test."""
    name = f"ck_{uuid.uuid4().hex[:12]}"
    _run(lambda: _execute(consumerkit_postgres_dsn, f'CREATE SCHEMA "{name}"'))
    yield name
    _run(lambda: _execute(consumerkit_postgres_dsn, f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))


@pytest.fixture
def consumerkit_dsn(consumerkit_postgres_dsn: str, consumerkit_schema: str) -> str:
    """The server's DSN with ``search_path`` set to ``consumerkit_schema``."""
    return with_search_path(consumerkit_postgres_dsn, consumerkit_schema)


@pytest.fixture(scope="session")
def consumerkit_kafka_bootstrap() -> Iterator[str]:
    """A Kafka-protocol broker: ``$CONSUMERKIT_TEST_KAFKA_BOOTSTRAP``, else Tansu."""
    bootstrap = os.environ.get(KAFKA_ENV)
    if bootstrap:
        yield bootstrap
        return
    with start_tansu() as broker:
        yield broker.bootstrap


@pytest.fixture
def consumerkit_topic(consumerkit_kafka_bootstrap: str) -> NewTopic:
    """``consumerkit_topic(partitions=1)``: create a uniquely named topic, return its name."""

    def new(partitions: int = 1) -> str:
        name = f"ck-{uuid.uuid4().hex[:12]}"
        _run(lambda: create_topic(consumerkit_kafka_bootstrap, name, partitions))
        return name

    return new


def pytest_report_header(config: pytest.Config) -> list[str]:
    dsn = os.environ.get(POSTGRES_ENV)
    kafka = os.environ.get(KAFKA_ENV)
    return [f"consumerkit fixtures: postgres {redact_dsn(dsn) if dsn else 'embedded'}, "
            f"kafka {kafka or 'Tansu'} (each started on first use)"]
