"""Text a producer chose, where an operator reads it: through the real text log formatter, into
dead-letter details on real PostgreSQL and out of ``consumerkit dead-letters``, a forged line,
a terminal escape sequence, a 10 KB value and a database error's row values do not survive."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from datetime import UTC, datetime

import asyncpg
import orjson
import pytest

from consumerkit import DeadLetterEntry, DeadLetterTable
from consumerkit.cli import main
from consumerkit.deadletter.table import list_dead_letters
from consumerkit.display import displayable
from consumerkit.envelope import Envelope, Record
from consumerkit.logs import JsonFormatter, configure_logging
from consumerkit.observability.logging import LogObserver
from consumerkit.parking.entry import ParkedRecord
from consumerkit.parking.store import park
from consumerkit.shared.failures import describe
from consumerkit.types import SinkResources

FORGED = "x\n2026-11-29 00:00:00,000 CRITICAL consumerkit.fake: INJECTED"
TERMINAL = "x\x1b]0;PWNED\x07\x1b[2J"
HUGE_TYPE = "t" * 10_240


@pytest.fixture
def text_logs(capsys: pytest.CaptureFixture[str]) -> Iterator[logging.Logger]:
    """The CLI's text logging to stderr, restored afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    configure_logging("text", "INFO")
    try:
        yield logging.getLogger("consumerkit.pipeline")
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def stderr_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().err.splitlines()


def record(offset: int = 7) -> Record:
    return Record("orders", 0, offset, b"k", b"{}")


def envelope(event_type: str, event_id: str = "e-1") -> Envelope:
    return Envelope(event_id, "header", event_type, "k", "orders", 0, 7, None)


async def check_violation(pool: asyncpg.Pool[asyncpg.Record], schema: str,
                          label: str) -> asyncpg.PostgresError:
    """The error PostgreSQL gives for a row with ``label`` that breaks a CHECK: its DETAIL
    quotes the row."""
    await pool.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    await pool.execute(f'CREATE TABLE IF NOT EXISTS "{schema}".items '
                       "(label text, n int CHECK (n >= 0))")
    with pytest.raises(asyncpg.CheckViolationError) as raised:
        await pool.execute(f'INSERT INTO "{schema}".items VALUES ($1, -1)', label)
    assert "INJECTED" in str(raised.value)  # asyncpg puts DETAIL in the error's text
    return raised.value


# -- the escaping itself -----------------------------------------------------------------------

@pytest.mark.parametrize(("text", "shown"), [
    ("a\nb\rc\td", "a\\nb\\rc\\td"),
    ("\x00\x1b\x7f", "\\x00\\x1b\\x7f"),
    ("\x85\x9b", "\\x85\\x9b"),  # C1: NEL and CSI
    ("a\u2028b\u2029c", "a\\u2028b\\u2029c"),
    ("\u202eevil\u202c \u2066x\u2069 \u200f\u061c",
     "\\u202eevil\\u202c \\u2066x\\u2069 \\u200f\\u061c"),
    ("\udcff", "\\udcff"),
    ("ordinary: café, 東京, 🙂, a\\nb", "ordinary: café, 東京, 🙂, a\\nb"),
])
def test_control_characters_are_escaped_visibly(text: str, shown: str) -> None:
    assert displayable(text) == shown
    assert displayable(shown) == shown


def test_a_long_value_is_cut_with_its_length() -> None:
    shown = displayable("a" * 10_240, 100)
    assert len(shown) == 100
    assert shown.endswith("… [10240 characters]")
    assert displayable(shown, 100) == shown


# -- text logs ---------------------------------------------------------------------------------

async def test_a_database_error_forges_no_log_line_and_shows_no_row_values(
    pg_pool: asyncpg.Pool[asyncpg.Record], pg_schema: str, text_logs: logging.Logger,
    capsys: pytest.CaptureFixture[str],
) -> None:
    error = await check_violation(pg_pool, pg_schema, FORGED)
    detail = describe(error)
    assert detail.startswith("CheckViolationError: new row for relation \"items\" violates")
    assert "INJECTED" not in detail
    assert "Failing row" not in detail
    wrapped = describe(RuntimeError(f"could not store: {error}"))
    assert "INJECTED" not in wrapped
    assert "could not store" in wrapped
    LogObserver("billing", text_logs).dead_lettered(
        record(), envelope("item.added"), "add_item", "handler_failed", detail, 4)
    text_logs.warning("the value was %s", FORGED)  # an argument with a line of its own
    lines = stderr_lines(capsys)
    assert len(lines) == 2, lines
    assert "CheckViolationError" in lines[0]
    assert lines[1].endswith("the value was x\\n2026-11-29 00:00:00,000 CRITICAL "
                             "consumerkit.fake: INJECTED")


async def test_retries_and_tracebacks_of_a_database_error_show_no_row_values(
    pg_pool: asyncpg.Pool[asyncpg.Record], pg_schema: str, text_logs: logging.Logger,
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
) -> None:
    error = await check_violation(pg_pool, pg_schema, FORGED)
    with caplog.at_level(logging.INFO, logger="consumerkit.pipeline"):
        LogObserver("billing", text_logs).retry(
            record(), envelope("item.added"), "add_item", 1, 0.5, error)
        try:
            raise RuntimeError("the handler gave up") from error
        except RuntimeError:
            text_logs.exception("handler failed")
    out = capsys.readouterr().err
    assert "CheckViolationError" in out
    assert "the handler gave up" in out  # the chain is shown past the dropped DETAIL
    assert "INJECTED" not in out
    assert "Failing row" not in out
    for logged in caplog.records:
        entry = orjson.loads(JsonFormatter().format(logged))
        assert "INJECTED" not in entry["message"]
        assert "INJECTED" not in entry.get("traceback", "")


def test_a_traceback_keeps_its_lines_but_none_passes_for_an_entry(
    text_logs: logging.Logger, capsys: pytest.CaptureFixture[str],
) -> None:
    try:
        raise ValueError(FORGED + TERMINAL)
    except ValueError:
        text_logs.exception("handler failed")
    lines = stderr_lines(capsys)
    assert lines[0].endswith("ERROR consumerkit.pipeline: handler failed")
    assert len(lines) > 3
    assert all(line.startswith("  ") for line in lines[1:])  # indented: no entry of its own
    assert lines[-2:] == ["  ValueError: x", "  2026-11-29 00:00:00,000 CRITICAL "
                          "consumerkit.fake: INJECTEDx\\x1b]0;PWNED\\x07\\x1b[2J"]


def test_a_10kb_event_type_is_cut_in_text_and_json_logs(
    text_logs: logging.Logger, capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    whole = f"no handler for event type {HUGE_TYPE!r}"
    with caplog.at_level(logging.WARNING, logger="consumerkit.pipeline"):
        LogObserver("billing", text_logs).dead_lettered(
            record(), envelope(HUGE_TYPE), "", "unknown_event_type", whole, 0)
    [line] = stderr_lines(capsys)
    assert len(line) < 1200  # before: over 10,240
    assert f"… [{len(whole)} characters]" in line
    [logged] = caplog.records
    entry = orjson.loads(JsonFormatter().format(logged))
    assert len(entry["message"]) < 1200
    assert len(entry["event_type"]) <= 1000
    assert entry["event_type"].endswith("… [10240 characters]")


def test_json_logs_still_escape_by_themselves(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("consumerkit.pipeline")
    with caplog.at_level(logging.WARNING, logger="consumerkit.pipeline"):
        log.warning("odd event %s", FORGED + TERMINAL,
                    extra={"event_type": TERMINAL, "event_id": FORGED})
    line = JsonFormatter().format(caplog.records[0])
    assert "\n" not in line
    assert "\x1b" not in line
    entry = orjson.loads(line)
    assert entry["message"] == f"odd event {FORGED}{TERMINAL}"  # exact, once decoded
    assert (entry["event_type"], entry["event_id"]) == (TERMINAL, FORGED)


# -- dead letters and their listing ------------------------------------------------------------

async def test_dead_letter_details_and_the_listing_show_escaped_text(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool[asyncpg.Record],
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = ["--postgres", postgres_dsn, "--schema", pg_schema]
    assert await asyncio.to_thread(main, ["migrate", *db]) == 0
    sink = DeadLetterTable()
    await sink.open(SinkResources(pg_pool, pg_schema, "unused:9092", {}))
    error = await check_violation(pg_pool, pg_schema, FORGED)
    huge = f"no handler for event type {HUGE_TYPE!r}"
    for offset, (event_id, event_type, detail) in enumerate([
            (TERMINAL, f"x\n{datetime.now(UTC):%Y-%m-%d %H:%M:%S} fake orders/0/9 id=e",
             FORGED),
            ("e-2", TERMINAL, describe(error)),
            ("e-3", HUGE_TYPE, huge)]):
        await sink.send(DeadLetterEntry(
            consumer="billing", topic="orders", partition=0, offset=offset, key=b"k",
            value=b"{}", headers=[], reason="handler_failed", detail=detail,
            event_id=event_id, event_type=event_type))
    async with pg_pool.acquire() as conn:
        stored = await list_dead_letters(conn, pg_schema, "billing")
    assert stored[0].detail == "x\\n2026-11-29 00:00:00,000 CRITICAL consumerkit.fake: INJECTED"
    assert "INJECTED" not in stored[1].detail
    assert len(stored[2].detail) <= 2000  # before: over 10,240
    assert stored[2].detail.endswith(f"… [{len(huge)} characters]")
    assert stored[0].event_id == TERMINAL  # the record's own fields are kept as they were

    capsys.readouterr()
    code = await asyncio.to_thread(main, ["dead-letters", *db, "--consumer", "billing"])
    out = capsys.readouterr().out
    assert code == 0
    assert "\x1b" not in out
    assert "\x07" not in out
    lines = out.splitlines()
    assert len(lines) == 4, lines  # three entries and the count: no forged entry
    assert "id=x\\x1b]0;PWNED\\x07\\x1b[2J type=x\\n" in lines[0]
    assert "type=x\\x1b]0;PWNED\\x07\\x1b[2J" in lines[1]
    assert len(lines[2]) < 2500
    assert "… [10240 characters]" in lines[2]


async def test_the_parked_listing_shows_keys_and_details_escaped(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool[asyncpg.Record],
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = ["--postgres", postgres_dsn, "--schema", pg_schema]
    assert await asyncio.to_thread(main, ["migrate", *db]) == 0
    async with pg_pool.acquire() as conn:
        await park(conn, pg_schema, [ParkedRecord(
            consumer="billing", topic="orders", partition=0, offset=3,
            key=TERMINAL.encode(), value=b"{}", headers=[], timestamp_ms=None,
            reason="handler_failed", detail=FORGED + TERMINAL)], start=True)
    capsys.readouterr()
    code = await asyncio.to_thread(main, ["parked", "list", *db])
    out = capsys.readouterr().out
    assert code == 0
    assert "\x1b" not in out
    assert "\x07" not in out
    lines = out.splitlines()
    assert len(lines) == 2, lines  # the key and the count: no forged line
    assert lines[0].endswith("handler_failed: x\\n2026-11-29 00:00:00,000 CRITICAL "
                             "consumerkit.fake: INJECTEDx\\x1b]0;PWNED\\x07\\x1b[2J")
