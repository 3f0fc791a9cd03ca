"""Each bad input gives one line, ``consumerkit: ...``, and its exit status (1, or 2 for a
usage error), without a traceback unless ``--debug``; never a password."""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from consumerkit.cli import main
from consumerkit.cli.target import EXPECTED

from .conftest import PASSWORD, cli, with_password

BAD_DSNS = [
    ("postgresql://app:{pw}@127.0.0.1:abc/x", "malformed PostgreSQL DSN postgresql://app:***@"
     "127.0.0.1:abc/x: a port must be a number from 0 to 65535"),
    ("postgresql://app:{pw}@127.0.0.1:99999/x", "malformed PostgreSQL DSN "
     "postgresql://app:***@127.0.0.1:99999/x: a port must be a number from 0 to 65535"),
    ("mysql://app:{pw}@127.0.0.1/x", "malformed PostgreSQL DSN mysql://app:***@127.0.0.1/x: "
     "not a postgresql:// or postgres:// URL"),
    ("postgresql://app:{pw}@no-such-host.invalid/x", "cannot connect to PostgreSQL at "
     "postgresql://app:***@no-such-host.invalid/x: unknown host 'no-such-host.invalid'"),
    ("postgresql://app:{pw}@127.0.0.1:1/x", "cannot connect to PostgreSQL at "
     "postgresql://app:***@127.0.0.1:1/x: connection refused"),
]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("consumerkit: "), err
    assert "Traceback" not in err
    assert PASSWORD not in err
    return lines[0]


@pytest.mark.parametrize(("dsn", "expected"), BAD_DSNS)
@pytest.mark.parametrize("command", [["migrate"], ["dead-letters"], ["outbox", "failed"],
                                     ["dedup", "partitions"], ["relay"], ["config", "relay"]])
def test_a_bad_dsn_is_one_line_in_every_command(
    capsys: pytest.CaptureFixture[str], command: list[str], dsn: str, expected: str,
) -> None:
    code, out, err = run(capsys, *command, "--postgres", dsn.format(pw=PASSWORD))
    if command[0] == "config":  # config connects to nothing: it shows the DSN, redacted
        assert code == 0
        assert PASSWORD not in out + err
        return
    assert code == 1
    assert one_line(err).startswith(f"consumerkit: {expected}"), err


async def test_a_missing_role_or_database_keeps_the_servers_words(
    postgres_dsn: str, capsys: pytest.CaptureFixture[str],
) -> None:
    parts = urlsplit(with_password(postgres_dsn))
    no_db = urlunsplit(parts._replace(path="/no_such_db"))
    code, _, err = await asyncio.to_thread(run, capsys, "migrate", "--postgres", no_db)
    assert code == 1
    assert 'database "no_such_db" does not exist' in one_line(err)
    netloc = f"no_such_role:{PASSWORD}@{parts.netloc.rpartition('@')[2]}"
    no_role = urlunsplit(parts._replace(netloc=netloc))
    code, _, err = await asyncio.to_thread(run, capsys, "migrate", "--postgres", no_role)
    assert code == 1
    line = one_line(err)
    assert 'role "no_such_role" does not exist' in line or "authentication failed" in line


@pytest.mark.parametrize("command", [["dead-letters"], ["outbox", "failed"]])
async def test_a_table_never_migrated_names_the_command_that_creates_it(
    postgres_dsn: str, pg_schema: str, capsys: pytest.CaptureFixture[str],
    command: list[str],
) -> None:
    code, _, err = await asyncio.to_thread(run, capsys, *command, "--postgres", postgres_dsn,
                                           "--schema", pg_schema)
    assert code == 1
    line = one_line(err)
    assert "does not exist" in line
    assert "run `consumerkit migrate`" in line


@pytest.mark.parametrize("argv", [["dead-letters", "--limit", "-1"],
                                  ["outbox", "failed", "--limit", "-5"],
                                  ["outbox", "cleanup", "--batch", "0"],
                                  ["run", "app:c", "--metrics-port", "x", "--log-format", "xml"]])
def test_usage_errors_exit_two(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "error: argument" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(("target", "expected"), [
    ("no_such_module:consumer", "cannot import module 'no_such_module' (no module named "
     "'no_such_module'): run from the directory that holds it, or add that directory to "
     "PYTHONPATH"),
    ("app_consumer:no_such_attr", "module 'app_consumer' has no attribute 'no_such_attr'"),
    ("app_consumer", "'app_consumer': write MODULE:ATTR, e.g. billing.app:consumer"),
    ("app_consumer:SCHEMA", f"app_consumer:SCHEMA is a str, not a Consumer: {EXPECTED}"),
    ("app_consumer:charge", "app_consumer:charge is a handler (of event type 'charge'), not "
     f"a Consumer: {EXPECTED}"),
    ("app_consumer:registry", f"app_consumer:registry is a HandlerRegistry, not a Consumer: "
     f"{EXPECTED}"),
    ("app_consumer:GatedDeadLetters", "app_consumer:GatedDeadLetters is a class that needs "
     f"arguments (gate), not a Consumer: {EXPECTED}"),
    ("app_consumer:Consumer", f"app_consumer:Consumer is the Consumer class, not a Consumer: "
     f"{EXPECTED}"),
    ("app_consumer:nothing", f"app_consumer:nothing() returned a NoneType, not a Consumer: "
     f"{EXPECTED}"),
])
async def test_run_names_a_missing_module_or_attribute(
    app_dir: Path, target: str, expected: str,
) -> None:
    done = await cli("run", target, "--postgres", f"postgresql://a:{PASSWORD}@127.0.0.1:1/x",
                     cwd=app_dir)
    assert done.code == 1
    assert one_line(done.err) == f"consumerkit: {expected}"


async def test_debug_shows_the_traceback(app_dir: Path) -> None:
    done = await cli("--debug", "run", "app_consumer:no_such_attr", cwd=app_dir)
    assert done.code == 1
    assert "Traceback (most recent call last)" in done.err
    assert done.err.strip().splitlines()[-1] == (
        "consumerkit: module 'app_consumer' has no attribute 'no_such_attr'")
    after = await cli("migrate", "--postgres", f"postgresql://a:{PASSWORD}@127.0.0.1:1/x",
                      "--debug", cwd=app_dir)
    assert after.code == 1
    assert "Traceback" in after.err


async def test_an_unreachable_broker_is_one_line(
    tmp_path: Path, postgres_dsn: str, pg_schema: str,
) -> None:
    dsn = with_password(postgres_dsn)
    assert (await cli("migrate", "--postgres", dsn, "--schema", pg_schema, cwd=tmp_path)).code == 0
    done = await cli("relay", "--postgres", dsn, "--schema", pg_schema, "--kafka",
                     "127.0.0.1:1", "--log-level", "critical", cwd=tmp_path)
    assert done.code == 1
    assert one_line(done.err) == (
        "consumerkit: cannot reach the Kafka broker at 127.0.0.1:1: no broker answered (is it "
        "running, and is the address right?)")
    done = await cli("dedup", "check", "--kafka", "no-such-host.invalid:9092", "--topic", "t",
                     cwd=tmp_path)
    assert done.code == 1
    assert "cannot reach the Kafka broker at no-such-host.invalid:9092" in one_line(done.err)


def test_a_setting_that_does_not_validate_names_flag_and_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONSUMERKIT_METRICS_PORT", "70000")
    code, _, err = run(capsys, "config", "relay")
    assert code == 1
    assert one_line(err) == ("consumerkit: invalid setting --metrics-port / "
                             "$CONSUMERKIT_METRICS_PORT: Input should be less than or equal "
                             "to 65535")
    monkeypatch.setenv("CONSUMERKIT_METRICS_PORT", "9100")
    code, _, err = run(capsys, "config", "relay", "--schema", "Bad-Schema")
    assert code == 1
    assert one_line(err) == ("consumerkit: invalid setting --postgres-schema / "
                             "$CONSUMERKIT_POSTGRES_SCHEMA: invalid schema name 'Bad-Schema': use "
                             "1-63 characters of a-z, 0-9 and _, starting with a letter or _")


@pytest.mark.parametrize("user", ["postgres", "app"])
async def test_run_shows_the_address_it_cannot_reach_as_check_does(
    app_dir: Path, user: str,
) -> None:
    """User, host, port and database; only a password is hidden (here: none to hide)."""
    dsn = f"postgresql://{user}@127.0.0.1:1/billing"
    done = await cli("run", "app_consumer:build", "--postgres", dsn, cwd=app_dir)
    assert done.code == 1
    assert one_line(done.err) == (f"consumerkit: cannot connect to PostgreSQL at {dsn}: "
                                  "connection refused (is PostgreSQL listening on that host "
                                  "and port?)")
    checked = await cli("check", "--postgres", dsn, cwd=app_dir)
    assert f"cannot connect to PostgreSQL at {dsn}: connection refused" in checked.out
