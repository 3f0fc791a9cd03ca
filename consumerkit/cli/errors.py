"""Errors a person can act on: each failure of a command becomes one line on stderr.

``consumerkit: <what went wrong, and what to do>``, exit status 1 (argparse's usage errors
exit with 2). A traceback only with ``--debug``. Every secret the command knows of (DSN
passwords, SASL and TLS passwords, each webhook header value, webhook secrets), whether from
a flag, a variable or the ``.env`` file, is replaced by ``***`` in the line, even where a
library quoted it.
"""

from __future__ import annotations

import contextlib
import re
import socket
from collections.abc import AsyncIterator, Iterable
from typing import Any

import asyncpg

from ..errors import ConsumerKitError
from ..shared.dsn import DsnError, dsn_secrets, parse_dsn, redact_dsn
from ..shared.pooler import connect

MIGRATE_HINT = "run `consumerkit migrate` (with the same --postgres and --schema) to create it"


class CommandError(ConsumerKitError):
    """A command failed in a way the person running it can fix."""


def _host(dsn: str) -> str:
    with contextlib.suppress(DsnError):
        hosts = parse_dsn(dsn).hosts
        return ", ".join(host for host, _port in hosts) or "localhost"
    return "the host"


def database_error(exc: BaseException, dsn: str) -> CommandError | None:
    """One line for what went wrong connecting to ``dsn`` (None: not a connection error)."""
    where = f"PostgreSQL at {redact_dsn(dsn)}"
    if isinstance(exc, socket.gaierror):
        return CommandError(f"cannot connect to {where}: unknown host {_host(dsn)!r}")
    if isinstance(exc, ConnectionRefusedError):
        return CommandError(f"cannot connect to {where}: connection refused (is PostgreSQL "
                            "listening on that host and port?)")
    if isinstance(exc, TimeoutError):
        return CommandError(f"cannot connect to {where}: no answer within 15 s")
    if isinstance(exc, OSError):
        return CommandError(f"cannot connect to {where}: {exc.strerror or exc}")
    if isinstance(exc, DsnError):
        return CommandError(str(exc))
    if isinstance(exc, ValueError | OverflowError | asyncpg.ClientConfigurationError):
        # asyncpg's words may quote a part of the DSN: keep none of its secrets
        return CommandError(f"malformed PostgreSQL DSN {redact_dsn(dsn)}: "
                            f"{scrub(str(exc), dsn_secrets(dsn))} (expected "
                            "postgresql://user:password@host:5432/database)")
    if _refusal(exc):
        # the server's own words: 'role "x" does not exist', 'password authentication failed'
        return CommandError(f"PostgreSQL at {redact_dsn(dsn)} refused the connection: "
                            f"{scrub(str(exc), dsn_secrets(dsn))}")
    if isinstance(exc, asyncpg.PostgresError | asyncpg.InterfaceError):
        return CommandError(f"PostgreSQL at {redact_dsn(dsn)} failed while connecting: "
                            f"{type(exc).__name__}: {scrub(str(exc), dsn_secrets(dsn))}")
    return None


# SQLSTATE classes and codes of a server (or a pooler) turning a connection away: connection
# exceptions, authorization, an unknown database, too many connections, not accepting yet
_REFUSALS = ("08", "28", "3D000", "53300", "57P03")


def _refusal(exc: BaseException) -> bool:
    if isinstance(exc, asyncpg.InterfaceError):
        return True
    code = getattr(exc, "sqlstate", None) or ""
    return isinstance(exc, asyncpg.PostgresError) and code.startswith(_REFUSALS)


@contextlib.asynccontextmanager
async def database(dsn: str | None) -> AsyncIterator[asyncpg.Connection[Any]]:
    """A connection to ``dsn``; every failure to connect, and a table that was never created,
    is a :class:`CommandError`."""
    if not dsn:
        raise CommandError("no database: pass --postgres or set CONSUMERKIT_POSTGRES_DSN")
    try:
        parse_dsn(dsn)  # what asyncpg would misread, or refuse quoting the password
    except DsnError as exc:
        raise CommandError(str(exc)) from None
    try:
        # a command's few statements gain nothing from a statement cache; without one they
        # also work through a transaction pooler that was not declared
        conn = await connect(dsn, pooler="transaction")
    except Exception as exc:
        error = database_error(exc, dsn)
        if error is None:
            raise
        raise error from None
    try:
        yield conn
    except (asyncpg.UndefinedTableError, asyncpg.UndefinedFunctionError,
            asyncpg.InvalidSchemaNameError) as exc:
        raise CommandError(f"{exc}: {MIGRATE_HINT}") from None
    finally:
        await conn.close()


async def check_database(dsn: str | None) -> None:
    """Connect once, so a wrong DSN is reported here, in the words above."""
    async with database(dsn):
        pass


_BOOTSTRAP = re.compile(r"KafkaConnectionError: Unable to bootstrap from \[.*\]")


def one_line(exc: BaseException) -> str | None:
    """The message for an exception a person can act on (None: a bug, keep the traceback)."""
    if isinstance(exc, ConsumerKitError):
        text = str(exc).split("\n")[0]
        return _BOOTSTRAP.sub("no broker answered (is it running, and is the address right?)",
                              text)
    if type(exc).__name__ in ("KafkaConnectionError", "KafkaTimeoutError"):
        # raised by the Kafka client directly (the demo's topic creation): known by name, so
        # that aiokafka stays imported in the transport module alone
        return f"cannot reach the Kafka broker: {exc} (is it running, and is the address right?)"
    if isinstance(exc, ModuleNotFoundError) and exc.name in ("httpx", "redis"):
        extra = "webhook" if exc.name == "httpx" else "redis"
        return f"this needs the {extra!r} extra: pip install 'consumerkit[{extra}]'"
    return None


def scrub(line: str, secrets: Iterable[str]) -> str:
    """``line`` with every secret replaced by ``***``."""
    for secret in sorted((s for s in secrets if s and len(s) >= 3), key=len, reverse=True):
        line = line.replace(secret, "***")
    return line
