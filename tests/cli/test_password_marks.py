"""A password holding '/', '?', '#' or '@', raw or percent-encoded, in a DSN pointing at a
closed port: no command shows it, nor any part of it, on stdout, stderr, in a log line or in
a ``--debug`` traceback."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from consumerkit.cli import main

from .conftest import cli

PASSWORDS = ["Hunter2/Zq9pw", "Hunter2?Zq9pw", "Hunter2#Zq9pw", "Hunter2@Zq9pw",
             "Hunter2%2FZq9pw", "Hunter2%3F%23Zq9pw"]
SHOWN = "postgresql://billing:***@127.0.0.1:1/billing"


def commands(dsn: str) -> list[list[str]]:
    db = ["--postgres", dsn]
    return [["config", "run", "app_consumer:build", *db], ["config", "relay", *db],
            ["migrate", *db], ["check", *db], ["dead-letters", *db], ["parked", "list", *db],
            ["run", "app_consumer:build", *db, "--log-level", "debug"],
            ["relay", *db, "--kafka", "127.0.0.1:1", "--log-level", "debug"]]


@pytest.mark.parametrize("password", PASSWORDS)
def test_no_command_shows_any_part_of_the_password(
    password: str, app_dir: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.chdir(app_dir)
    monkeypatch.setenv("CLI_TEST_TOPIC", "orders")
    monkeypatch.delitem(sys.modules, "app_consumer", raising=False)
    dsn = f"postgresql://billing:{password}@127.0.0.1:1/billing"
    for argv in commands(dsn):
        for debug in ([], ["--debug"]):
            caplog.clear()
            with caplog.at_level(logging.DEBUG):
                code = main([*debug, *argv])
            out = capsys.readouterr()
            logged = "\n".join(f"{r.getMessage()} {r.exc_text}" for r in caplog.records)
            for text in (out.out, out.err, logged):
                assert "Zq9" not in text, (argv, debug, text)
                assert "Hunter2" not in text, (argv, debug, text)
            if argv[0] == "config":
                assert code == 0
                assert SHOWN in out.out  # the host and database still shown
            else:
                assert code == 1, (argv, out.err)
                assert SHOWN in out.out + out.err, (argv, out.err)
                if argv[0] != "check":  # check reports the problem in its listing
                    assert ("Traceback" in out.err) == bool(debug), (argv, out.err)


async def test_run_and_relay_in_their_own_process_show_no_password(app_dir: Path) -> None:
    dsn = "postgresql://billing:Hunter2?Zq9pw@127.0.0.1:1/billing"
    env = {"CLI_TEST_TOPIC": "orders", "CONSUMERKIT_POSTGRES_DSN": dsn}
    for argv in (["run", "--debug", "app_consumer:consumer", "--log-level", "debug"],
                 ["relay", "--debug", "--kafka", "127.0.0.1:1", "--log-format", "json"]):
        done = await cli(*argv, cwd=app_dir, env=env)
        assert done.code == 1, done
        assert "Zq9" not in done.output, done
        assert "Hunter2" not in done.output, done
        assert f"consumerkit: malformed PostgreSQL DSN {SHOWN}: percent-encode" in done.err
