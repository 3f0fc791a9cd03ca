"""A DSN holding a password: the password appears in no command's output nor log line, nor
in the settings models' reprs."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from pydantic import SecretStr

from consumerkit import Consumer, DedupPolicy
from consumerkit.cli import _parser, _secrets, main
from consumerkit.cli.check_deployment import Deployment
from consumerkit.cli.errors import scrub
from consumerkit.settings import ConsumerSettings, RelaySettings

from .app_consumer import charge
from .conftest import PASSWORD, cli, with_password

UNREACHABLE = f"postgresql://app:{PASSWORD}@127.0.0.1:1/x"


def test_the_settings_reprs_hide_every_secret() -> None:
    consumer = ConsumerSettings(postgres={"dsn": UNREACHABLE},
                                kafka={"sasl_plain_password": PASSWORD, "ssl_password": PASSWORD})
    relay = RelaySettings(postgres={"dsn": UNREACHABLE},
                          webhook_headers={"Authorization": f"Bearer {PASSWORD}"})
    for settings in (consumer, relay):
        for text in (repr(settings), str(settings), settings.model_dump_json(),
                     repr(settings.model_dump())):
            assert PASSWORD not in text
    assert consumer.dsn() == UNREACHABLE  # the driver still gets it
    assert isinstance(relay.webhook_headers["Authorization"], SecretStr)
    assert consumer.kafka.client_options()["sasl_plain_password"] == PASSWORD
    built = Consumer(name="c", handlers=[charge], topics=["t"], **consumer.options())
    assert PASSWORD not in repr(built)
    assert "app:***@" in repr(built)


def every_command(dsn: str, schema: str) -> list[list[str]]:
    db = ["--postgres", dsn, "--schema", schema]
    return [
        ["migrate", *db], ["migrate", *db],
        ["dead-letters", *db], ["dedup", "partitions", *db], ["dedup", "maintain", *db],
        ["outbox", "failed", *db], ["outbox", "retry", "--all", *db],
        ["outbox", "skip", "--all", *db], ["outbox", "cleanup", "--older-than", "7d", *db],
        ["migrate", "--outbox-only", *db], ["check", *db], ["config", "relay", *db],
        ["config", "run", *db, "--kafka-sasl-plain-password", PASSWORD],
        ["relay", *db, "--kafka", "127.0.0.1:1", "--log-level", "debug"],
        ["demo", "--postgres", UNREACHABLE, "--kafka", "127.0.0.1:1"],
        *([c[0], *c[1:2], "--postgres", UNREACHABLE] for c in (
            ["migrate"], ["dead-letters"], ["dedup", "partitions"], ["outbox", "failed"],
            ["check"], ["relay"])),
    ]


async def test_no_command_prints_or_logs_the_password(
    postgres_dsn: str, pg_schema: str, capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    dsn = with_password(postgres_dsn)
    codes = []
    for argv in every_command(dsn, pg_schema):
        caplog.clear()
        with caplog.at_level(logging.DEBUG):
            code = await asyncio.to_thread(main, argv)
        out = capsys.readouterr()
        logged = "\n".join(f"{r.getMessage()} {r.args!r} {r.exc_text}" for r in caplog.records)
        for text in (out.out, out.err, logged):
            assert PASSWORD not in text, (argv, text)
        assert "Traceback" not in out.err, argv
        codes.append(code)
    assert codes[:13] == [0] * 13  # the ones against the real database succeed
    assert set(codes[13:]) == {1}  # the others fail, in one line each


async def test_run_prints_and_logs_no_password(
    app_dir: Path, postgres_dsn: str, pg_schema: str,
) -> None:
    env = {"CLI_TEST_SCHEMA": pg_schema, "CLI_TEST_TOPIC": "orders",
           "CONSUMERKIT_POSTGRES_DSN": with_password(postgres_dsn)}
    for argv in (["run", "app_consumer:consumer", "--kafka", "127.0.0.1:1", "--log-level",
                  "debug", "--log-format", "json"],
                 ["run", "app_consumer:consumer", "--postgres", UNREACHABLE],
                 ["config", "run", "app_consumer:consumer"],
                 ["check", "app_consumer:consumer", "--kafka", "127.0.0.1:1"]):
        done = await cli(*argv, cwd=app_dir, env=env)
        assert PASSWORD not in done.output, argv
        assert "Traceback" not in done.err, argv


def test_the_error_line_scrubs_secrets_from_env_files_and_each_header_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # what a library's message could quote: the DSN's password from .env, a header's value
    token, key = "tok-Bearer-9f8e7d", "api-key-1a2b3c"
    env_file = tmp_path / "deploy.env"
    env_file.write_text(f"CONSUMERKIT_POSTGRES_DSN={UNREACHABLE}\n"
                        f'CONSUMERKIT_WEBHOOK_HEADERS={{"X-Api-Key": "{key}"}}\n')
    monkeypatch.setenv("CONSUMERKIT_WEBHOOK_HEADERS",
                       f'{{"Authorization": "Bearer {token}", "X-Api-Key": "{key}"}}')
    for argv in (["relay", "--env-file", str(env_file)],
                 ["config", "relay", "--env-file", str(env_file)]):
        args = _parser().parse_args(argv)
        line = scrub(f"refused {UNREACHABLE} with password {PASSWORD}, headers Bearer {token} "
                     f"and {key}", _secrets(args))
        assert not {PASSWORD, token, key} & set(line.replace(",", " ").split()), (argv, line)
        assert line == "refused *** with password ***, headers *** and ***"


def test_check_repr_hides_the_dsn_and_the_kafka_options() -> None:
    deployment = Deployment(
        dsn=UNREACHABLE, bootstrap="127.0.0.1:9092", schema="billing", policy=DedupPolicy(),
        topics=["orders"], outboxes=[], kafka_options={"sasl_plain_password": PASSWORD})
    assert PASSWORD not in repr(deployment)
    assert "127.0.0.1:9092" in repr(deployment)  # what is not secret is still shown
