"""Numbers and files the CLI is given: out of range, not a number, a file that is not there,
each a usage error (exit status 2) in one line, before anything is connected to."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumerkit.cli import main

UNREACHABLE = ["--postgres", "postgresql://app@127.0.0.1:1/x"]


@pytest.mark.parametrize(("argv", "expected"), [
    (["dead-letters", "--limit", "9223372036854775808", *UNREACHABLE],
     "argument --limit: must be from 0 to 2147483647, got 9223372036854775808"),
    (["parked", "list", "--limit", "100000000000000000000", *UNREACHABLE],
     "argument --limit: must be from 0 to 2147483647, got 100000000000000000000"),
    (["parked", "list", "--limit", "1e20", *UNREACHABLE],
     "argument --limit: not a whole number: '1e20'"),
    (["outbox", "failed", "--limit", "2147483648", *UNREACHABLE],
     "argument --limit: must be from 0 to 2147483647"),
    (["outbox", "maintain", "--retention", "7d", "--premake", "99999", *UNREACHABLE],
     "argument --premake: must be from 1 to 1000, got 99999"),
    (["topics", "create", "zz", "--partitions", "99999999999", "--kafka", "127.0.0.1:1"],
     "argument --partitions: must be from 1 to 10000, got 99999999999"),
    (["check", "--min-replication", "40000", *UNREACHABLE],
     "argument --min-replication: must be from 1 to 32767, got 40000"),
    (["check", "--page-size", "9" * 50, *UNREACHABLE],
     "argument --page-size: must be from 1 to 2147483647, got a 50-digit number"),
    (["offsets", "forget", "--consumer", "c", "--topic", "t", "--partition", "2147483648",
      *UNREACHABLE], "argument --partition: must be from 0 to 2147483647"),
    (["dead-letters", "--limit", "9" * 5000, *UNREACHABLE],
     "argument --limit: not a whole number: '" + "9" * 40 + "... (5000 characters)'"),
    (["relay", "--env-file", "/nonexistent/deploy.env", *UNREACHABLE],
     "argument --env-file: no such file: '/nonexistent/deploy.env'"),
    (["run", "app:c", "--env-file", "/nonexistent/deploy.env"],
     "argument --env-file: no such file: '/nonexistent/deploy.env'"),
    (["config", "relay", "--env-file", "/"], "argument --env-file: is a directory: '/'"),
])
def test_a_bad_number_or_file_is_a_one_line_usage_error(
    capsys: pytest.CaptureFixture[str], argv: list[str], expected: str,
) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    out = capsys.readouterr()
    assert out.out == ""
    lines = out.err.splitlines()
    assert len(lines) == 1, out.err
    assert expected in lines[0], lines[0]
    assert lines[0].endswith("--help)")


def test_an_env_file_given_is_read_and_the_default_may_be_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)  # no .env here: no error
    for variable in ("CONSUMERKIT_BATCH_SIZE", "CONSUMERKIT_POSTGRES_DSN"):
        monkeypatch.delenv(variable, raising=False)
    assert main(["config", "relay"]) == 0
    assert "batch_size" in capsys.readouterr().out
    (tmp_path / "deploy.env").write_text("CONSUMERKIT_BATCH_SIZE=7\n")
    assert main(["config", "relay", "--env-file", "deploy.env"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("batch_size"))
    assert line.split()[1:2] == ["deploy.env"]
    assert line.split()[-1] == "7"


@pytest.mark.parametrize(("argv", "expected"), [
    (["config", "run", "--timeouts-handler", "inf"],
     "invalid setting --timeouts-handler / $CONSUMERKIT_TIMEOUTS_HANDLER: Input should be a "
     "finite number"),
    (["config", "run", "--timeouts-shutdown", "1e300"],
     "invalid setting --timeouts-shutdown / $CONSUMERKIT_TIMEOUTS_SHUTDOWN: Input should be less "
     "than or equal to 86400"),
    (["config", "run", "--limits-max-in-flight", "99999999999999999999"],
     "invalid setting --limits-max-in-flight / $CONSUMERKIT_LIMITS_MAX_IN_FLIGHT: "
     "Input should be less than "
     "or equal to 10000000"),
    (["config", "relay", "--poll-interval", "nan"],
     "invalid setting --poll-interval / $CONSUMERKIT_POLL_INTERVAL: Input should be a finite "
     "number"),
])
def test_a_setting_out_of_bounds_is_one_line_naming_flag_and_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    argv: list[str], expected: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 1  # a setting may come from a variable: not a usage error
    assert capsys.readouterr().err == f"consumerkit: {expected}\n"
