"""``consumerkit migrate`` creates every table, idempotently, and says what it did;
``consumerkit check`` gives a healthy deployment its all-clear and names each problem; and
``consumerkit config`` shows where each setting came from."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from consumerkit.cli import main
from consumerkit.dedup.partitions import list_partitions
from consumerkit.outbox import OutboxRetention, OutboxTable
from consumerkit.schema import CORE_STEPS
from consumerkit.testing.services import MakeTopic

from ..pooling import POOLER_FLAG
from .conftest import PASSWORD, cli, with_password

TABLES = {"consumerkit_schema_version", "dead_letters", "consumerkit_retention",
          "consumerkit_names", "processed_events", "outbox", "outbox_failures", "outbox_keys",
          "orders_outbox", "orders_outbox_failures", "orders_outbox_keys"}


async def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = await asyncio.to_thread(main, list(argv))  # the CLI runs its own event loop
    out = capsys.readouterr()
    return code, out.out + out.err


async def tables(pool: asyncpg.Pool, schema: str) -> set[str]:
    """The names of the tables in ``schema``."""
    return {r["tablename"] for r in await pool.fetch(
        "SELECT tablename FROM pg_tables WHERE schemaname = $1", schema)}


def reported(out: str) -> list[str]:
    """The lines of ``migrate``'s report, without the warning it gives a superuser (the test
    servers' role is one)."""
    return [line for line in out.splitlines() if "runs as a superuser" not in line]


async def test_migrate_creates_every_table_once_and_says_so(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = ["--postgres", postgres_dsn, "--schema", pg_schema, "--outbox-table", "outbox",
          "--outbox-table", "orders_outbox"]
    code, out = await run(capsys, "migrate", *db)
    assert code == 0, out
    assert reported(out) == [
        "created dead-letter table, retention registry and consumer offsets (version 9)",
        "created dedup table processed_events (version 8)",
        "created parked keys, their records and audit (version 1)",
        "created outbox and its side tables outbox (version 2)",
        "created outbox and its side tables orders_outbox (version 2)",
        f"schema {pg_schema} is up to date"]
    made = await tables(pg_pool, pg_schema)
    assert made >= TABLES
    code, out = await run(capsys, "migrate", *db)
    assert code == 0, out
    assert reported(out) == [
        "dead-letter table, retention registry and consumer offsets: already present (version 9)",
        "dedup table processed_events: already present (version 8)",
        "parked keys, their records and audit: already present (version 1)",
        "outbox and its side tables outbox: already present (version 2)",
        "outbox and its side tables orders_outbox: already present (version 2)",
        f"schema {pg_schema} is up to date"]
    after = await tables(pg_pool, pg_schema)
    assert after == made


async def test_migrate_outbox_only_creates_the_outboxes_and_no_dedup_table(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = ["--postgres", postgres_dsn, "--schema", pg_schema, "--outbox-only"]
    code, out = await run(capsys, "migrate", *db, "--outbox-table", "outbox",
                          "--outbox-table", "orders_outbox")
    assert code == 0, out
    assert reported(out) == [
        "created outbox and its side tables outbox (version 2)",
        "created outbox and its side tables orders_outbox (version 2)",
        f"outboxes of schema {pg_schema} are up to date"]
    made = await tables(pg_pool, pg_schema)
    assert made == {"consumerkit_schema_version"} | {
        f"{t}{side}" for t in ("outbox", "orders_outbox")
        for side in ("", "_failures", "_keys", "_leases", "_relays")}
    # the runtime role's grants name the tables there are, none of the consumers' own
    code, out = await run(capsys, "migrate", *db, "--print-grants", "app_role")
    assert code == 0, out
    assert f'ON TABLE "{pg_schema}"."orders_outbox_failures" TO "app_role";' in out
    assert "dead_letters" not in out

    # an outbox kept for a retention brings the partition functions (component core) along
    kept = OutboxTable(pg_schema, "kept_outbox", OutboxRetention(timedelta(days=2)))
    try:
        code, out = await run(capsys, "migrate", *db, "--outbox-table", kept.table,
                              "--outbox-retention", "2d")
        assert code == 0, out
        assert reported(out) == [
            "created outbox and its side tables kept_outbox (version 2)",
            "created dead-letter table, retention registry and consumer offsets (version 9)",
            f"outboxes of schema {pg_schema} are up to date"]
        assert "processed_events" not in await tables(pg_pool, pg_schema)
    finally:
        await pg_pool.execute(f'DROP PUBLICATION IF EXISTS "{kept.publication}"')


async def test_migrate_outbox_only_refuses_the_dedup_tables_flags(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A dedup flag beside --outbox-only would do nothing: said in one line, before any
    table is made."""
    code, out = await run(capsys, "migrate", "--postgres", postgres_dsn, "--schema", pg_schema,
                          "--outbox-only", "--layout", "table", "--retention", "30d")
    assert code != 0
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    assert "Traceback" not in out
    assert "--retention, --layout would do nothing" in lines[0]
    assert not await tables(pg_pool, pg_schema)


def test_the_outbox_command_no_longer_migrates(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["outbox", "migrate", "--postgres", "postgresql://x@127.0.0.1:1/x"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument action: invalid choice: 'migrate'" in err
    assert "Traceback" not in err


@pytest.fixture
async def long_topic(kafka_bootstrap: str) -> AsyncIterator[str]:
    """A topic keeping its records 30 days: longer than the default dedup window."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap, request_timeout_ms=10_000)
    await admin.start()
    name = f"ck-c-{uuid.uuid4().hex[:8]}"
    await admin.create_topics([NewTopic(name, 1, 1, topic_configs={
        "retention.ms": str(30 * 86_400_000)})])
    try:
        yield name
    finally:
        await admin.delete_topics([name])
        await admin.close()


async def test_check_gives_the_all_clear_then_names_each_problem(
    postgres_dsn: str, direct_postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool,
    kafka_bootstrap: str, make_topic: MakeTopic, long_topic: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic = await make_topic(1)
    db = ["--postgres", postgres_dsn, "--schema", pg_schema]
    checked = [*db, *POOLER_FLAG]  # migrate needs no pooler setting, check is told it
    code, out = await run(capsys, "check", *checked)
    assert code == 1
    assert "PROBLEM  tables missing in schema" in out
    assert "run `consumerkit migrate`" in out

    assert (await run(capsys, "migrate", *db))[0] == 0
    healthy = [*checked, "--kafka", kafka_bootstrap, "--topic", topic, "--outbox-table", "outbox",
               "--min-replication", "1"]  # the test brokers' topics have one replica
    code, out = await run(capsys, "check", *healthy)
    assert code == 0, out
    assert out.splitlines()[-1] == "all clear"
    assert "PROBLEM" not in out

    problems = {
        "topics missing on the broker: no-such-topic": [*healthy, "--topic", "no-such-topic"],
        "cannot reach the Kafka broker at 127.0.0.1:1": [*checked, "--kafka", "127.0.0.1:1"],
        f"topic {long_topic} keeps records for 30d, longer than the dedup retention (7d)": [
            *healthy, "--topic", long_topic],
        "tables missing in schema": [*healthy, "--outbox-table", "never_made"],
        "cannot connect to PostgreSQL at postgresql://app:***@127.0.0.1:1/x": [
            "--postgres", f"postgresql://app:{PASSWORD}@127.0.0.1:1/x"],
        # a server setting in the DSN: a startup parameter PgBouncer refuses, so direct
        "synchronous_commit is off": [
            "--postgres", with_password(direct_postgres_dsn) + (
                "&" if "?" in direct_postgres_dsn else "?") + "synchronous_commit=off",
            "--schema", pg_schema],
    }
    for expected, argv in problems.items():
        code, out = await run(capsys, "check", *argv)
        assert code == 1, (expected, out)
        assert f"PROBLEM  {expected}" in out, out
        assert out.splitlines()[-1].endswith("found")
        assert PASSWORD not in out

    async with pg_pool.acquire() as conn:
        parts = await list_partitions(conn, pg_schema, "processed_events")
    now = await pg_pool.fetchval("SELECT now()")
    for part in parts:
        if part.lower is not None and part.lower > now:
            await pg_pool.execute(f'DROP TABLE "{pg_schema}"."{part.name}"')
    code, out = await run(capsys, "check", *checked)
    assert code == 1
    assert f"PROBLEM  dedup partitions of {pg_schema}.processed_events not created ahead" in out

    # a schema an older consumerkit migrated: its functions are the old ones
    await pg_pool.execute(f'DELETE FROM "{pg_schema}".consumerkit_schema_version '
                          "WHERE component = 'core' AND version = $1", CORE_STEPS[-1].version)
    code, out = await run(capsys, "check", *checked)
    assert code == 1
    assert (f"PROBLEM  schema {pg_schema} is older than this consumerkit (core "
            f"{CORE_STEPS[-2].version} of {CORE_STEPS[-1].version}): run `consumerkit migrate` "
            "as its owner") in out
    assert (await run(capsys, "migrate", *db))[0] == 0
    assert "is older than" not in (await run(capsys, "check", *checked))[1]


async def test_check_takes_a_consumers_own_settings(
    app_dir: Path, postgres_dsn: str, pg_schema: str, kafka_bootstrap: str,
) -> None:
    env = {"CLI_TEST_SCHEMA": pg_schema, "CLI_TEST_TOPIC": "no-such-topic-for-check",
           "CONSUMERKIT_POSTGRES_DSN": with_password(postgres_dsn),
           "CONSUMERKIT_KAFKA_BOOTSTRAP": kafka_bootstrap}
    done = await cli("check", "app_consumer:consumer", cwd=app_dir, env=env)
    assert done.code == 1
    assert f"tables missing in schema {pg_schema}" in done.out
    assert "topics missing on the broker: no-such-topic-for-check" in done.out
    assert PASSWORD not in done.output


async def test_config_shows_values_and_their_sources(
    app_dir: Path, postgres_dsn: str, pg_schema: str,
) -> None:
    (app_dir / ".env").write_text("CONSUMERKIT_METRICS_PORT=9100\n"
                                  f"CONSUMERKIT_KAFKA_SASL_PLAIN_PASSWORD={PASSWORD}\n")
    env = {"CLI_TEST_SCHEMA": pg_schema, "CLI_TEST_TOPIC": "orders",
           "CONSUMERKIT_POSTGRES_DSN": with_password(postgres_dsn),
           "CONSUMERKIT_LIMITS_MAX_BATCH": "50"}
    done = await cli("config", "run", "app_consumer:consumer", "--kafka", "broker:9092",
                     cwd=app_dir, env=env)
    assert done.code == 0, done.err
    rows = {line.split()[0]: line.split() for line in done.out.splitlines()[1:]}
    assert rows["kafka.bootstrap"][1:] == ["flag", "CONSUMERKIT_KAFKA_BOOTSTRAP", "broker:9092"]
    assert rows["postgres.dsn"][1] == "env"
    assert "***" in rows["postgres.dsn"][3]
    assert rows["metrics.port"][1:] == [".env", "CONSUMERKIT_METRICS_PORT", "9100"]
    assert rows["kafka.sasl_plain_password"][1:] == [
        ".env", "CONSUMERKIT_KAFKA_SASL_PLAIN_PASSWORD", "**********"]
    # the code sets 1
    assert rows["limits.max_batch"][1:] == ["code", "CONSUMERKIT_LIMITS_MAX_BATCH", "1"]
    assert rows["postgres.schema"][1:] == ["code", "CONSUMERKIT_POSTGRES_SCHEMA", pg_schema]
    assert PASSWORD not in done.output
