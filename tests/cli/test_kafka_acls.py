"""The broker's side of least privilege: on Apache Kafka with a TLS and SASL/SCRAM-SHA-512
listener and ACLs, the consumer and the relay run with only the rights docs/security.md lists
(the consumer: READ on its topics and its group; the relay: WRITE on its topics, with the
idempotent producer on), through the commands; a wrong password and each missing ACL is one
line naming what is missing. Skips, with the reason, without Java or Maven."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from consumerkit import migrate
from consumerkit.outbox import Outbox, OutboxTable
from tests.harness.kafka import KafkaCluster, start_kafka
from tests.harness.kafka_jars import MissingToolError
from tests.harness.kafka_security import ADMIN, Acl, KafkaSecurity

from ..brokers import KAFKA_VERSION
from .conftest import PASSWORD, Done, cli, finish, start, terminate, with_password

TOPIC = "billing.orders"
UNGRANTED = "billing.refunds"  # no principal but the admin may use it
GROUP = "billing"
EVENTS = 30
USERS = {"billing-consumer": "c0nsumer-pw", "billing-relay": "rel4y-pw",
         "no-group": "no-group-pw", "no-topic": "no-topic-pw", "no-write": "no-write-pw"}
ACLS = [
    # what docs/security.md gives each principal
    Acl("billing-consumer", "read", "topic", TOPIC),
    Acl("billing-consumer", "read", "group", GROUP),
    Acl("billing-relay", "write", "topic", TOPIC),
    # each of those rights missing once
    Acl("no-group", "read", "topic", TOPIC),
    Acl("no-topic", "read", "group", GROUP),
    Acl("no-write", "read", "topic", TOPIC),  # a consumer's rights given to a relay
]


@pytest.fixture(scope="module")
def secured() -> Iterator[tuple[KafkaCluster, KafkaSecurity]]:
    security = KafkaSecurity(USERS)
    try:
        cluster = start_kafka(brokers=1, version=KAFKA_VERSION, security=security)
    except MissingToolError as exc:
        pytest.skip(str(exc))
    with cluster:
        yield cluster, security


@pytest_asyncio.fixture(loop_scope="session")
async def cluster(secured: tuple[KafkaCluster, KafkaSecurity]) -> AsyncIterator[KafkaSecurity]:
    """The secured cluster with ``TOPIC`` and the ACLs, made once (the admin's PLAINTEXT)."""
    kafka, security = secured
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap, request_timeout_ms=30_000)
    await admin.start()
    try:
        if TOPIC not in await admin.list_topics():
            await admin.create_topics([NewTopic(TOPIC, 2, 1), NewTopic(UNGRANTED, 1, 1)])
            await security.grant(kafka.bootstrap, ACLS)
    finally:
        await admin.close()
    yield security


def settings(security: KafkaSecurity, user: str, password: str | None = None,
             ) -> dict[str, str]:
    """The CONSUMERKIT_* variables of a command connecting as ``user``."""
    assert security.ca_file is not None
    return {"CONSUMERKIT_KAFKA_BOOTSTRAP": security.bootstrap,
            "CONSUMERKIT_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "CONSUMERKIT_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "CONSUMERKIT_KAFKA_SASL_PLAIN_USERNAME": user,
            "CONSUMERKIT_KAFKA_SASL_PLAIN_PASSWORD": password or security.credentials()[user],
            "CONSUMERKIT_KAFKA_SSL_CAFILE": str(security.ca_file)}


async def stop(proc: asyncio.subprocess.Process) -> Done:
    """SIGTERM, unless it has ended already (then what it said)."""
    return await (terminate(proc) if proc.returncode is None else finish(proc))


def one_line(done: Done) -> str:
    assert done.code == 1, done.output
    assert "Traceback" not in done.err, done.err
    return done.err.strip().splitlines()[-1]


@pytest_asyncio.fixture(loop_scope="session")
async def schema(pg_pool: asyncpg.Pool[asyncpg.Record], pg_schema: str) -> str:
    """A schema with the outbox and the test consumer's ``charges`` table."""
    async with pg_pool.acquire() as conn:
        await migrate(conn, dedup=None, outboxes=[OutboxTable(pg_schema, "outbox")])
        await conn.execute(f'CREATE TABLE "{pg_schema}".charges (order_id text NOT NULL, '
                           "amount int NOT NULL)")
    return pg_schema


async def test_the_relay_and_the_consumer_run_under_their_acls(
    cluster: KafkaSecurity, schema: str, app_dir: Path, postgres_dsn: str,
    pg_pool: asyncpg.Pool[asyncpg.Record],
) -> None:
    outbox = Outbox(schema)
    async with pg_pool.acquire() as conn, conn.transaction():
        for n in range(EVENTS):
            await outbox.add(conn, event_type="charge", aggregate_type="order",
                             aggregate_id=f"order-{n % 5}",
                             payload={"order_id": f"order-{n}", "amount": n})
    dsn = with_password(postgres_dsn)
    common = {"CONSUMERKIT_POSTGRES_DSN": dsn, "CONSUMERKIT_POSTGRES_SCHEMA": schema}
    # the relay with the idempotent producer on (the default), WRITE on its topic only
    relay = await start("relay", "--route", TOPIC, "--log-level", "info", cwd=app_dir,
                        env={**common, **settings(cluster, "billing-relay")})
    consumer = await start("run", "app_consumer:build", cwd=app_dir, env={
        **common, **settings(cluster, "billing-consumer"), "CLI_TEST_SCHEMA": schema,
        "CLI_TEST_TOPIC": TOPIC, "CLI_TEST_GROUP": GROUP})
    charged = 0
    try:
        async with asyncio.timeout(120):
            while charged < EVENTS and relay.returncode is None and consumer.returncode is None:
                await asyncio.sleep(0.1)
                charged = await pg_pool.fetchval(
                    f'SELECT count(DISTINCT order_id) FROM "{schema}".charges')
    finally:
        relay_done = await stop(relay)
        consumer_done = await stop(consumer)
    assert charged == EVENTS, (relay_done.err, consumer_done.err)
    for done in (relay_done, consumer_done):
        assert done.code == 0, done.err
        assert "Traceback" not in done.err
        assert PASSWORD not in done.output
        assert USERS["billing-relay"] not in done.output
    assert f"stopped after publishing {EVENTS} events" in relay_done.err
    assert await pg_pool.fetchval(f'SELECT count(*) FROM "{schema}".charges') == EVENTS

    # the check command under the consumer's rights: it reads what READ shows
    done = await cli("check", "--topic", TOPIC, "--min-replication", "1", cwd=app_dir,
                     env={**common, **settings(cluster, "billing-consumer")})
    assert "Traceback" not in done.output
    assert f"ok       Kafka broker at {cluster.bootstrap} answers" in done.out
    assert f"ok       topics present: {TOPIC}" in done.out


async def test_a_wrong_password_is_one_line(
    cluster: KafkaSecurity, app_dir: Path, postgres_dsn: str, schema: str,
) -> None:
    env = {"CONSUMERKIT_POSTGRES_DSN": with_password(postgres_dsn),
           "CONSUMERKIT_POSTGRES_SCHEMA": schema,
           **settings(cluster, "billing-relay", password="not-the-password")}
    line = one_line(await cli("relay", "--route", TOPIC, cwd=app_dir, env=env))
    assert line == (
        f"consumerkit: the Kafka broker at {cluster.bootstrap} refused the SASL login of user "
        "'billing-relay' (SCRAM-SHA-512): wrong user name or password (sasl_plain_username, "
        "sasl_plain_password)")
    env.update({"CLI_TEST_SCHEMA": schema, "CLI_TEST_TOPIC": TOPIC, "CLI_TEST_GROUP": GROUP})
    done = await cli("run", "app_consumer:build", cwd=app_dir, env=env)
    assert one_line(done) == line
    assert "not-the-password" not in done.output


@pytest.mark.parametrize(("user", "missing"), [
    ("no-group", f"the consumer group '{GROUP}' (GROUP_AUTHORIZATION_FAILED): it needs an "
     "ACL allowing READ on that group"),
    ("no-topic", f"the topics {TOPIC} (TOPIC_AUTHORIZATION_FAILED): it needs an ACL allowing "
     "READ on each"),
])
async def test_a_consumer_missing_an_acl_is_one_line(
    cluster: KafkaSecurity, app_dir: Path, postgres_dsn: str, schema: str, user: str,
    missing: str,
) -> None:
    env = {"CONSUMERKIT_POSTGRES_DSN": with_password(postgres_dsn), **settings(cluster, user),
           "CLI_TEST_SCHEMA": schema, "CLI_TEST_TOPIC": TOPIC,
           "CLI_TEST_GROUP": GROUP}
    proc = await start("run", "app_consumer:build", cwd=app_dir, env=env)
    done = await finish(proc, timeout=120)
    assert one_line(done) == f"consumerkit: the Kafka broker denied user '{user}' {missing}"
    assert "not on the broker yet" not in done.err  # denied, not missing: not waited for


async def test_check_names_a_topic_its_principal_may_not_see(
    cluster: KafkaSecurity, app_dir: Path,
) -> None:
    done = await cli("check", "--topic", TOPIC, "--topic", "no-such-topic", cwd=app_dir,
                     env=settings(cluster, "no-topic"))
    assert "Traceback" not in done.output
    # Kafka does not tell a principal without DESCRIBE whether a topic exists
    assert (f"PROBLEM  topics denied to user 'no-topic': {TOPIC}, no-such-topic "
            "(TOPIC_AUTHORIZATION_FAILED, which a broker also answers for a topic it has not, "
            "to whoever may not describe it): it needs an ACL allowing READ on each it "
            "consumes, WRITE on each it publishes to") in done.out.splitlines()
    # with the right to see every topic (the cluster's super user), missing is missing
    done = await cli("check", "--topic", TOPIC, "--topic", "no-such-topic", cwd=app_dir,
                     env=settings(cluster, ADMIN))
    assert "PROBLEM  topics missing on the broker: no-such-topic" in done.out.splitlines()
    assert "denied" not in done.out


async def test_a_relay_without_write_is_one_line(
    cluster: KafkaSecurity, app_dir: Path, postgres_dsn: str, schema: str,
) -> None:
    env = {"CONSUMERKIT_POSTGRES_DSN": with_password(postgres_dsn),
           "CONSUMERKIT_POSTGRES_SCHEMA": schema,
           **settings(cluster, "no-write")}
    line = one_line(await cli("relay", "--route", TOPIC, cwd=app_dir, env=env))
    assert line == (
        f"consumerkit: the Kafka broker at {cluster.bootstrap} refused the idempotent producer "
        "to user 'no-write' (InitProducerId answered ClusterAuthorizationFailedError): it "
        "needs an ACL allowing WRITE on the topics it publishes to (or IDEMPOTENT_WRITE on "
        "the cluster); or turn it off with --no-enable-idempotence or "
        "CONSUMERKIT_ENABLE_IDEMPOTENCE=false")



async def test_a_relay_routed_to_a_topic_it_may_not_write_names_the_acl(
    cluster: KafkaSecurity, app_dir: Path, postgres_dsn: str, schema: str,
    pg_pool: asyncpg.Pool[asyncpg.Record],
) -> None:
    """Its producer id granted (WRITE on its own topic), a topic denied: a fixed route stops
    the relay at start, an event a template routes there is refused for good (FAILED, until
    `outbox retry`); both in a line naming the ACL."""
    env = {"CONSUMERKIT_POSTGRES_DSN": with_password(postgres_dsn),
           "CONSUMERKIT_POSTGRES_SCHEMA": schema,
           **settings(cluster, "billing-relay")}
    missing = (f"the Kafka broker denied user 'billing-relay' the topic {UNGRANTED} "
               "(TOPIC_AUTHORIZATION_FAILED): it needs an ACL allowing WRITE on it")
    line = one_line(await cli("relay", "--route", UNGRANTED, cwd=app_dir, env=env))
    assert line == f"consumerkit: {missing}"

    async with pg_pool.acquire() as conn, conn.transaction():
        await Outbox(schema).add(conn, event_type="refund", aggregate_type=UNGRANTED,
                                 aggregate_id="order-1", payload={"order_id": "order-1"})
    relay = await start("relay", "--route", "{aggregate_type}", cwd=app_dir, env=env)
    failed = f'SELECT count(*) FROM "{schema}".outbox_failures WHERE failed'
    try:
        async with asyncio.timeout(60):
            while relay.returncode is None and not await pg_pool.fetchval(failed):
                await asyncio.sleep(0.1)
    finally:
        done = await stop(relay)
    assert done.code == 0, done.err
    assert "Traceback" not in done.err
    refused = [line for line in done.err.splitlines() if "FAILED" in line]
    assert len(refused) == 1, done.err
    assert (f"PermanentSendError: {missing}; FAILED, its aggregate waits for retry or skip"
            in refused[0])
    assert "not on the broker" not in done.err  # denied, not missing
