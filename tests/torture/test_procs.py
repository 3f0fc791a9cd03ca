"""Why a harness process died by itself, as its report says: the error its log ends with."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .procs import exit_reason


def test_the_error_a_process_died_of_is_read_from_its_log(tmp_path: Path) -> None:
    log = tmp_path / "consumer-0.log"
    with log.open("wb") as out:
        subprocess.run(
            [sys.executable, "-c", "import logging; logging.warning('database: starting up');"
             "from consumerkit.errors import StartupError; "
             "raise StartupError('cannot connect to PostgreSQL: the database is starting up')"],
            stdout=out, stderr=subprocess.STDOUT, check=False)
    assert exit_reason(log) == ("consumerkit.errors.StartupError: cannot connect to "
                                "PostgreSQL: the database is starting up")


def test_a_log_without_an_error_says_unknown(tmp_path: Path) -> None:
    log = tmp_path / "relay-0.log"
    log.write_text("2026-11-24 06:00:00,000 WARNING x: ValueError: not the cause\n")
    assert exit_reason(log) == "unknown"
    assert exit_reason(tmp_path / "missing.log") == "unknown"
