"""``consumerkit relay`` as a subprocess: it publishes pending outbox rows to the topic its
route names, and exits with 0 on SIGTERM."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import asyncpg

from consumerkit.outbox import Outbox, OutboxTable
from consumerkit.testing.services import MakeTopic

from ..brokers import IDEMPOTENCE
from ..outbox.conftest import pending, read_all, wait_until
from .conftest import PASSWORD, cli, finish, start, terminate, with_password

EVENTS = 40


async def test_relay_publishes_pending_rows_and_stops_on_sigterm(
    tmp_path: Path, postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic,
    pg_schema: str, pg_pool: asyncpg.Pool,
) -> None:
    dsn = with_password(postgres_dsn)
    migrated = await cli("migrate", "--schema", pg_schema, cwd=tmp_path,
                         env={"CONSUMERKIT_POSTGRES_DSN": dsn})
    assert migrated.code == 0, migrated.err
    table = OutboxTable(pg_schema, "outbox")
    outbox = Outbox(pg_schema)
    async with pg_pool.acquire() as conn, conn.transaction():
        for n in range(EVENTS):
            await outbox.add(conn, event_type="order.placed", aggregate_type="order",
                             aggregate_id=f"order-{n % 7}", payload={"n": n})
    topic = await make_topic(2)
    env = {"CONSUMERKIT_POSTGRES_DSN": dsn, "CONSUMERKIT_POSTGRES_SCHEMA": pg_schema,
           "CONSUMERKIT_ENABLE_IDEMPOTENCE": str(IDEMPOTENCE).lower()}
    proc = await start("relay", "--kafka", kafka_bootstrap, "--route", topic,
                       "--batch-size", "7", "--log-level", "info", cwd=tmp_path, env=env)

    async def drained() -> bool:
        return await pending(pg_pool, table) == 0

    try:
        await wait_until(drained, 60, "the relay to publish every row")
    except AssertionError:
        if proc.returncode is None:
            proc.kill()
        done = await finish(proc)
        raise AssertionError(done.err) from None
    records = await read_all(kafka_bootstrap, [topic], lambda found: len(found) >= EVENTS)
    assert sorted(int(r.value.decode().split(":")[1].strip(" }")) for r in records
                  if r.value) == list(range(EVENTS))
    done = await terminate(proc)
    assert done.code == 0, done.err
    assert "Traceback" not in done.err
    assert "SIGTERM received" in done.err
    assert f"stopped after publishing {EVENTS} events" in done.err
    assert "garbage collector: " in done.err
    assert "start-up objects frozen" in done.err
    assert PASSWORD not in done.output


async def test_relay_without_its_table_names_the_command_that_creates_it(
    tmp_path: Path, postgres_dsn: str, pg_schema: str,
) -> None:
    done = await cli("relay", "--postgres", with_password(postgres_dsn), "--schema", pg_schema,
                     "--kafka", "127.0.0.1:1", cwd=tmp_path)
    assert done.code == 1
    assert done.err.strip() == (
        f"consumerkit: no outbox table {pg_schema}.outbox: run `consumerkit migrate "
        "--outbox-table outbox` (with the same --postgres and --schema) to create it")


class Hook(BaseHTTPRequestHandler):
    """Records each POST's authorization header and body."""

    seen: ClassVar[list[tuple[str | None, bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Hook.seen.append((self.headers.get("Authorization"), body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # quiet
        return None


async def test_relay_posts_to_a_webhook_with_its_headers_kept_secret(
    tmp_path: Path, postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool,
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        dsn = with_password(postgres_dsn)
        env = {"CONSUMERKIT_POSTGRES_DSN": dsn, "CONSUMERKIT_POSTGRES_SCHEMA": pg_schema}
        assert (await cli("migrate", cwd=tmp_path, env=env)).code == 0
        async with pg_pool.acquire() as conn, conn.transaction():
            for n in range(5):
                await Outbox(pg_schema).add(conn, event_type="order.placed",
                                            aggregate_type="order", aggregate_id=f"o-{n}",
                                            payload={"n": n})
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        proc = await start("relay", "--webhook-url", url, "--webhook-header",
                           f"Authorization: Bearer {PASSWORD}", "--log-level", "debug",
                           cwd=tmp_path, env=env)

        async def delivered() -> bool:
            return len(Hook.seen) >= 5

        await wait_until(delivered, 60, "five webhook deliveries")
        done = await terminate(proc)
    finally:
        server.shutdown()
        server.server_close()
    assert done.code == 0, done.err
    assert {auth for auth, _ in Hook.seen} == {f"Bearer {PASSWORD}"}
    assert PASSWORD not in done.output
