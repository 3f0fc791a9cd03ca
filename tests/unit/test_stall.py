"""Which failures stall a consumer (every record would hit them) and which are the record's own;
and how a stall is held, probed and ended."""

from __future__ import annotations

import asyncio
import logging
import re

import asyncpg
import pytest

from consumerkit import DeadLetter, Retry
from consumerkit.engine.stall import SYSTEMIC, Breaker, StallPolicy, Verdict, systemic
from consumerkit.observability import BaseObserver, LogObserver
from consumerkit.stats import ConsumerStats, StatsObserver


class Told(BaseObserver):
    def __init__(self) -> None:
        self.reasons: list[str | None] = []

    def stalled(self, reason: str | None) -> None:
        self.reasons.append(reason)


MISSING = Verdict("handler h cannot run: undefined_table", "h", certain=True)


def breaker(after_keys: int = 3) -> tuple[Breaker, Told]:
    told = Told()
    return Breaker(StallPolicy(after_keys=after_keys, initial_delay=0.1, max_delay=0.4),
                   told), told


@pytest.mark.parametrize(("error", "name"), [
    (asyncpg.UndefinedTableError('relation "ledger" does not exist'), "undefined_table"),
    (asyncpg.UndefinedColumnError('column "total" does not exist'), "undefined_column"),
    (asyncpg.InvalidSchemaNameError('schema "app" does not exist'), "invalid_schema_name"),
    (asyncpg.InsufficientPrivilegeError("permission denied for table ledger"),
     "insufficient_privilege"),
    (asyncpg.ReadOnlySQLTransactionError("cannot execute INSERT in a read-only transaction"),
     "read_only_sql_transaction"),
])
def test_the_database_refusing_its_shape_or_rights_is_systemic(
    error: Exception, name: str,
) -> None:
    assert systemic(error) == name
    assert SYSTEMIC[error.sqlstate] == name  # type: ignore[attr-defined]


@pytest.mark.parametrize("error", [
    asyncpg.UniqueViolationError("duplicate key value violates unique constraint"),
    asyncpg.CheckViolationError("new row violates check constraint"),
    asyncpg.NotNullViolationError("null value in column"),
    asyncpg.DataError("invalid input syntax for type integer"),
    asyncpg.DeadlockDetectedError("deadlock detected"),
    asyncpg.UndefinedFunctionError("function f(text) does not exist"),
    ValueError("bad amount"),
    ConnectionError("downstream refused"),
])
def test_errors_of_the_data_or_of_the_moment_are_not(error: Exception) -> None:
    assert systemic(error) is None


def test_a_handler_error_raised_from_a_missing_table_is_systemic() -> None:
    wrapped = RuntimeError("could not save")
    wrapped.__cause__ = asyncpg.UndefinedTableError('relation "ledger" does not exist')
    assert systemic(wrapped) == "undefined_table"
    verdict = breaker()[0].failed("h", "k", wrapped)
    assert verdict is not None
    assert verdict.certain
    assert verdict.reason == ('handler h cannot run: undefined_table: UndefinedTableError: '
                              'relation "ledger" does not exist')  # the cause says what
    wrapped.__cause__ = None
    assert systemic(wrapped) is None


def test_the_same_error_for_many_keys_in_a_row_stalls() -> None:
    b, _ = breaker(after_keys=3)
    assert b.failed("h", "k1", ConnectionError("refused")) is None
    assert b.failed("h", "k1", ConnectionError("refused")) is None  # one key, retried: poison
    assert b.failed("h", "k2", ConnectionError("refused")) is None
    verdict = b.failed("h", "k3", ConnectionError("refused"))
    assert verdict is not None
    assert not verdict.certain
    assert verdict.reason == "handler h failed for 3 keys in a row: ConnectionError: refused"


@pytest.mark.parametrize("between", ["success", "other type", "other handler"])
def test_a_streak_ends_with_a_success_or_another_error_type(between: str) -> None:
    b, _ = breaker(after_keys=3)
    b.failed("h", "k1", ConnectionError())
    b.failed("h", "k2", ConnectionError())
    if between == "success":
        b.succeeded("h")
    elif between == "other type":
        b.failed("h", "k9", TimeoutError())
    else:  # another handler's failures neither break nor count towards this one's
        b.failed("g", "k9", ConnectionError())
    stalled = b.failed("h", "k3", ConnectionError()) is not None
    assert stalled is (between == "other handler")


def test_the_handler_s_own_decisions_never_stall() -> None:
    class Refused(Exception):
        retriable = False

    b, _ = breaker(after_keys=2)
    for error in (DeadLetter("no"), Retry(), Refused()):
        for key in ("k1", "k2", "k3"):
            assert b.failed("h", key, error) is None
    missing = asyncpg.UndefinedTableError("x")
    decided = DeadLetter("given up")
    decided.__cause__ = missing
    assert b.failed("h", "k", decided) is None
    assert b.failed("h", "k", missing) is not None


def test_zero_keys_leaves_only_the_sqlstates() -> None:
    b, _ = breaker(after_keys=0)
    assert all(b.failed("h", f"k{i}", ConnectionError()) is None for i in range(50))
    assert b.failed("h", "k", asyncpg.InsufficientPrivilegeError("denied")) is not None


async def test_one_record_probes_the_others_wait_and_a_success_ends_the_stall() -> None:
    b, told = breaker()
    changes: list[bool] = []
    b.on_change = lambda: changes.append(b.holding())
    first, second = object(), object()
    delay = b.stall(first, MISSING)
    assert delay is not None
    assert 0.05 <= delay <= 0.1
    assert b.stall(second, MISSING) is None  # it waits
    assert b.holding()
    assert told.reasons == ["handler h cannot run: undefined_table"]
    waiter = asyncio.create_task(b.turn(second, asyncio.Event()))
    await asyncio.sleep(0)
    assert not waiter.done()
    later = b.stall(first, MISSING)
    assert later is not None
    assert 0.1 <= later <= 0.2  # backs off
    b.resolved(second)  # not the probe: changes nothing
    assert b.reason is not None
    b.resolved(first)
    assert await asyncio.wait_for(waiter, 5) is True
    assert b.reason is None
    assert not b.holding()
    assert told.reasons[-1] is None
    assert changes[-1] is False


async def test_a_probe_that_leaves_hands_over_and_abandon_ends_a_wait() -> None:
    b, _ = breaker()
    probe, other, gone = object(), object(), object()
    b.stall(probe, MISSING)
    abandon = asyncio.Event()
    quitting = asyncio.create_task(b.turn(gone, abandon))
    taking = asyncio.create_task(b.turn(other, asyncio.Event()))
    await asyncio.sleep(0)
    abandon.set()
    assert await asyncio.wait_for(quitting, 5) is False
    b.leave(probe)
    assert await asyncio.wait_for(taking, 5) is True
    assert b.probe is other  # still stalled: the next one tries
    assert b.reason == MISSING.reason


def test_the_back_off_is_capped() -> None:
    policy = StallPolicy(initial_delay=0.5, multiplier=2.0, max_delay=4.0)
    assert all(2.0 <= policy.delay(n) <= 4.0 for n in range(4, 200))


def test_stats_count_stalls() -> None:
    stats = ConsumerStats()
    observer = StatsObserver(stats)
    observer.stalled("r")
    observer.stalled(None)
    observer.stalled("r")
    assert stats.stalls == 2


def test_a_stall_is_logged_as_an_error_and_its_end_with_its_length(
    caplog: pytest.LogCaptureFixture,
) -> None:
    observer = LogObserver("billing")
    with caplog.at_level(logging.INFO, logger="consumerkit.pipeline"):
        observer.stalled(MISSING.reason)
        observer.stalled(None)
    began, ended = caplog.records
    assert began.levelno == logging.ERROR
    assert began.getMessage().startswith(
        "consumer billing stalled: handler h cannot run: undefined_table;")
    assert began.consumer == "billing"  # type: ignore[attr-defined]
    assert ended.levelno == logging.WARNING
    assert re.fullmatch(r"consumer billing resumed after a stall of \d+\.\ds", ended.getMessage())


async def test_the_probes_take_turns_so_a_poison_probe_cannot_hold_a_stall() -> None:
    b, _ = breaker(after_keys=2)
    error = ConnectionError("HTTP 400")  # a poison record's error, of the outage's type
    b.failed("h", "k1", error)
    reason = b.failed("h", "k2", error)
    assert reason is not None
    poison, other = object(), object()
    assert b.stall(poison, reason) is not None  # the poison record probes first
    waiting = asyncio.create_task(b.turn(other, asyncio.Event()))
    await asyncio.sleep(0)
    assert not waiting.done()
    # its try failed the same way; after its back-off it comes back: the other one tries
    back = asyncio.create_task(b.turn(poison, asyncio.Event()))
    assert await asyncio.wait_for(waiting, 5) is True
    assert b.probe is other
    assert not back.done()
    b.resolved(other)  # the other record passed: the stall is over for the poison one too
    assert await asyncio.wait_for(back, 5) is True
    assert b.reason is None


async def test_a_probe_failing_for_its_own_reason_hands_over_and_the_last_one_ends_it() -> None:
    b, told = breaker()
    poison, other = object(), object()
    assert b.stall(poison, MISSING) is not None
    waiting = asyncio.create_task(b.turn(other, asyncio.Event()))
    await asyncio.sleep(0)
    b.leave(poison)  # its own failure (a ValueError, say) tells nothing of the table
    assert await asyncio.wait_for(waiting, 5) is True
    assert (b.probe, b.reason) == (other, MISSING.reason)
    assert told.reasons == ["handler h cannot run: undefined_table"]  # one stall, no flap
    b.leave(other)  # the last one leaves, nothing waits: nothing is held back
    assert (b.probe, b.reason) == (None, None)
    assert told.reasons[-1] is None
    assert not b.holding()
