"""``consumerkit dev`` as a user runs it: in the background, without a terminal; the README's
commands then work in that folder with no flag, and SIGTERM stops everything."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import orjson
import pytest
from aiokafka import AIOKafkaConsumer
from dotenv import dotenv_values

from .conftest import HERE, Done, cli, start, terminate

READY = "stop with Ctrl-C or SIGTERM"


async def _printed_until(proc: asyncio.subprocess.Process, line: str, timeout: float) -> str:
    assert proc.stdout is not None
    seen: list[str] = []
    async with asyncio.timeout(timeout):
        while not seen or line not in seen[-1]:
            text = (await proc.stdout.readline()).decode()
            if not text:
                pytest.fail(f"consumerkit dev ended before it was ready: {''.join(seen)}")
            seen.append(text)
    return "".join(seen)


async def _first_record(bootstrap: str, topic: str) -> bytes:
    reader = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await reader.start()
    try:
        async with asyncio.timeout(60):
            record = await reader.getone()
        value: bytes = record.value
        return value
    finally:
        await reader.stop()


async def test_dev_serves_the_readme_commands_and_stops_on_sigterm(tmp_path: Path) -> None:
    shutil.copy(HERE / "app_dev.py", tmp_path / "app_dev.py")
    env_file = tmp_path / ".env"
    dev = await start("dev", "--topic", "orders:2", cwd=tmp_path)
    stopped: Done | None = None
    try:
        printed = await _printed_until(dev, READY, timeout=120)
        settings = dotenv_values(env_file)
        dsn = settings["CONSUMERKIT_POSTGRES_DSN"]
        bootstrap = settings["CONSUMERKIT_KAFKA_BOOTSTRAP"]
        assert dsn
        assert bootstrap
        password = urlsplit(dsn).password
        assert password
        assert password not in printed
        assert stat.S_IMODE(os.stat(env_file).st_mode) == 0o600

        wrong = await cli("migrate", "--postgres", dsn.replace(password, "not-it"),
                          cwd=tmp_path)
        assert wrong.code == 1, wrong
        assert "password authentication failed" in wrong.err
        assert password not in wrong.output

        for argv in (["migrate"], ["topics", "create", "payments", "--partitions", "1"],
                     ["check", "app_dev:consumer"]):
            done = await cli(*argv, cwd=tmp_path)
            assert done.code == 0, (argv, done)
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("CREATE TABLE charges (order_id text PRIMARY KEY, amount int)")
        finally:
            await conn.close()

        run = await start("run", "app_dev:consumer", cwd=tmp_path)
        relay = await start("relay", cwd=tmp_path)  # route {aggregate_type}: payments
        sent = await cli("send", "orders", "--type", "order.created", "--key", "o-1",
                         "--payload", '{"order_id": "o-1", "amount": 5}', "--id", "e-1",
                         "--wait", "billing", "--timeout", "90", cwd=tmp_path, timeout=120)
        assert sent.code == 0, sent
        assert "billing: applied by app_dev.charge" in sent.out
        again = await cli("send", "orders", "--type", "order.created", "--key", "o-1",
                          "--payload", '{"order_id": "o-1", "amount": 5}', "--id", "e-1",
                          "--wait", "billing", cwd=tmp_path)
        assert "this one is a duplicate" in again.out, again
        assert orjson.loads(await _first_record(bootstrap, "payments")) == {"order_id": "o-1"}
        looked = await cli("lookup", "e-1", cwd=tmp_path)
        assert looked.code == 0, looked
        assert "applied by app_dev.charge" in looked.out
        for proc in (run, relay):
            done = await terminate(proc)
            assert done.code == 0, done
    finally:
        stopped = await terminate(dev, timeout=60)
    assert stopped.code == 0, stopped
    assert "Traceback" not in stopped.err
    assert not env_file.exists()
    socket_dir = dict(part.split("=", 1) for part in urlsplit(dsn).query.split("&"))["host"]
    assert not os.path.exists(socket_dir)  # noqa: ASYNC240 - the database's files are gone
    host, port = bootstrap.rsplit(":", 1)
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection(host, int(port))


async def test_dev_refuses_an_env_file_it_did_not_write(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("CONSUMERKIT_POSTGRES_DSN=postgresql://prod/billing\n")
    done = await cli("dev", cwd=tmp_path)
    assert done.code == 1
    assert done.err.strip().splitlines() == [
        "consumerkit: .env exists and was not written by consumerkit dev: move it away or "
        "pass --env-file OTHER"]
    assert (tmp_path / ".env").read_text().startswith("CONSUMERKIT_POSTGRES_DSN")


async def test_send_refuses_a_payload_that_is_not_a_json_object(tmp_path: Path) -> None:
    for payload, said in (("[1, 2]", "must be a JSON object, not list"),
                          ("{nope", "--payload is not JSON")):
        done = await cli("send", "orders", "--type", "t", "--payload", payload,
                         "--kafka", "127.0.0.1:1", cwd=tmp_path)
        assert done.code == 1, done
        assert said in done.err
        assert "Traceback" not in done.err
