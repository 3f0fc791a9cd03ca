"""``consumerkit dev``: a local stack in one command, for a laptop or a CI job.

PostgreSQL (embedded, with a password: a wrong one is refused as in production), a Tansu
broker and Redis start; the settings every other command reads go to a ``.env`` file in the
current folder (``migrate``, ``topics``, ``check``, ``run``, ``relay`` and ``send`` then work
with no flag), the topics asked for are created, and the stack runs until SIGTERM or Ctrl-C,
then stops its servers and removes the file it wrote. Nothing waits on a terminal.

The password is random per run and written only to the file (mode 0600), never printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING
from urllib.parse import quote, urlsplit

import asyncpg

from ..shared.identifiers import redact_dsn
from .common import sub
from .errors import CommandError
from .topics import create_topic, topic_name

if TYPE_CHECKING:
    from ..testing.services import EmbeddedPostgres

MARKER = "# written by consumerkit dev"
ROLE = "consumerkit"
_MAX_PARTITIONS = 1000
_HBA = """\
# consumerkit dev: passwords everywhere, so a wrong one fails as it does in production
local all all scram-sha-256
host all all 127.0.0.1/32 scram-sha-256
host all all ::1/128 scram-sha-256
"""
_READY_TIMEOUT = 15.0


def topic_spec(text: str) -> tuple[str, int]:
    """``NAME`` or ``NAME:PARTITIONS`` (4 partitions by default)."""
    name, sep, count = text.partition(":")
    if not sep:
        return topic_name(name), 4
    if not count.isdigit() or not 1 <= int(count) <= _MAX_PARTITIONS:
        raise argparse.ArgumentTypeError(
            f"invalid partitions in {text!r}: a whole number from 1 to {_MAX_PARTITIONS}")
    return topic_name(name), int(count)


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dev = sub(commands, "dev", "run PostgreSQL, a Kafka-protocol broker and Redis locally "
              "until SIGTERM or Ctrl-C",
              "Start embedded PostgreSQL (with a password), a Tansu broker and Redis, write "
              "the settings the other commands read to .env, create the topics given, and "
              "run until SIGTERM or Ctrl-C; then stop everything and remove the file. Needs "
              "the embedded extra.")
    dev.add_argument("--topic", dest="topics", action="append", type=topic_spec, default=[],
                     metavar="NAME[:PARTITIONS]",
                     help="create this topic (4 partitions unless given; repeat for several)")
    dev.add_argument("--env-file", type=Path, default=Path(".env"),
                     help="where to write the settings; refused if it exists and "
                          "consumerkit dev did not write it")
    dev.add_argument("--no-redis", dest="redis", action="store_false",
                     help="do not start Redis")
    dev.set_defaults(handler=dev_command)


def dev_command(args: argparse.Namespace) -> int:
    from ..testing.services import require_embedded, start_postgres, start_redis, start_tansu

    require_embedded("consumerkit dev")
    env_file: Path = args.env_file
    _refuse_foreign(env_file)
    stop = _stop_on_signals()
    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(start_tansu())
        postgres = stack.enter_context(start_postgres())
        redis = stack.enter_context(start_redis()) if args.redis else None
        dsn = asyncio.run(_secure(postgres))
        for name, partitions in args.topics:
            asyncio.run(create_topic(broker.bootstrap, name, partitions))
        values = {
            "CONSUMERKIT_POSTGRES_DSN": dsn,
            "CONSUMERKIT_KAFKA_BOOTSTRAP": broker.bootstrap,
            # Tansu has no idempotent producer (InitProducerId): the relay turns it off here
            "CONSUMERKIT_ENABLE_IDEMPOTENCE": "false",
            # for a team's own tests (the pytest plugin reads these)
            "CONSUMERKIT_TEST_POSTGRES_DSN": dsn,
            "CONSUMERKIT_TEST_KAFKA_BOOTSTRAP": broker.bootstrap,
        }
        if redis is not None:
            values["CONSUMERKIT_TEST_REDIS_URL"] = redis.url
        _write(env_file, values)
        stack.callback(env_file.unlink, missing_ok=True)
        _tell(env_file, dsn, broker.bootstrap, redis.url if redis else None, args.topics)
        alive = {"Tansu": broker.running, "PostgreSQL": postgres.accepts}
        if redis is not None:
            alive["Redis"] = redis.running
        while not stop.wait(1.0):
            if dead := [name for name, check in alive.items() if not check()]:
                raise CommandError(f"{', '.join(dead)} stopped by itself; everything else "
                                   "is stopped")
        print("consumerkit dev: stopping", flush=True)
    return 0


def _refuse_foreign(env_file: Path) -> None:
    try:
        first = env_file.read_text(errors="replace").partition("\n")[0]
    except FileNotFoundError:
        return
    except OSError as exc:
        raise CommandError(f"cannot read {env_file}: {exc.strerror}") from None
    if not first.startswith(MARKER):
        raise CommandError(f"{env_file} exists and was not written by consumerkit dev: "
                           "move it away or pass --env-file OTHER")


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop


async def _secure(postgres: EmbeddedPostgres) -> str:
    """Create the ``consumerkit`` role and database, require passwords, and return the
    role's DSN once a wrong password is refused."""
    password = secrets.token_urlsafe(18)  # URL-safe: the DSN needs no quoting
    admin = await asyncpg.connect(postgres.dsn)
    try:
        await admin.execute(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{password}'")
        await admin.execute(f"CREATE DATABASE {ROLE} OWNER {ROLE}")
        # the superuser gets a password nobody knows: the stack is the role's alone
        await admin.execute(
            f"ALTER ROLE postgres PASSWORD '{secrets.token_urlsafe(18)}'")
        hba = await admin.fetchval("SHOW hba_file")
        await asyncio.to_thread(Path(hba).write_text, _HBA)
        await admin.execute("SELECT pg_reload_conf()")
    finally:
        await admin.close()
    parts = urlsplit(postgres.dsn)
    dsn = f"postgresql://{ROLE}:{password}@/{ROLE}?{parts.query}"
    await _wait_refused(f"postgresql://{ROLE}:wrong-{password}@/{ROLE}?{parts.query}")
    return dsn


async def _wait_refused(wrong: str) -> None:
    """Wait until the server has read the new rules: a wrong password is refused."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _READY_TIMEOUT
    while True:
        try:
            conn = await asyncpg.connect(wrong)
        except asyncpg.InvalidPasswordError:
            return
        await conn.close()
        if loop.time() > deadline:
            raise CommandError("the local PostgreSQL still accepts any password after "
                               f"{_READY_TIMEOUT:.0f} s")
        await asyncio.sleep(0.1)


def _write(env_file: Path, values: dict[str, str]) -> None:
    lines = [f"{MARKER} (pid {os.getpid()}); removed when it stops"]
    lines += [f"{name}={_quoted(value)}" for name, value in values.items()]
    fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write("\n".join(lines) + "\n")


def _quoted(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def _tell(env_file: Path, dsn: str, bootstrap: str, redis: str | None,
          topics: list[tuple[str, int]]) -> None:
    lines = [
        "consumerkit dev: ready",
        f"  PostgreSQL  {redact_dsn(dsn)}  (user {ROLE}; the password is in {env_file})",
        f"  Kafka       {bootstrap}  (Tansu: the relay runs with enable_idempotence off)",
    ]
    if redis is not None:
        lines.append(f"  Redis       {redis}")
    lines += [f"  topic       {name} ({partitions} partitions)" for name, partitions in topics]
    lines += [
        f"settings written to {env_file}: consumerkit commands run in this folder read it",
        f"  for your shell: set -a; . {quote(str(env_file), safe='/._-')}; set +a",
        "stop with Ctrl-C or SIGTERM",
    ]
    print("\n".join(lines), flush=True)
