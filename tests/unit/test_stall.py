"""Which failures stall a consumer (every record would hit them) and which are the record's own;
and how a stall is held, probed and ended."""

from __future__ import annotations

import asyncio
import logging
import re

import asyncpg
import pytest

from consumerkit import DeadLetter, Retry
from consumerkit.engine.stall import Breaker, StallPolicy, Verdict
from consumerkit.engine.systemic import SYSTEMIC, systemic
from consumerkit.observability import BaseObserver, LogObserver
from consumerkit.shared.failures import HandlerFailure, judge
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


@pytest.mark.parametrize("error", [
    asyncpg.CheckViolationError("new row violates check constraint"),
    asyncpg.UniqueViolationError("duplicate key value violates unique constraint"),
    asyncpg.NotNullViolationError("null value in column"),
    asyncpg.ForeignKeyViolationError("violates foreign key constraint"),
    asyncpg.NumericValueOutOfRangeError("integer out of range"),
    asyncpg.CharacterNotInRepertoireError("invalid byte sequence for encoding UTF8: 0x00"),
    asyncpg.DataError("invalid input syntax for type integer"),
])
def test_data_and_integrity_errors_never_stall_however_many_keys(error: Exception) -> None:
    wrapped = RuntimeError("could not book")  # the handler's own error, raised from it
    wrapped.__cause__ = error
    for raised in (error, wrapped):
        b, _ = breaker(after_keys=3)
        assert all(b.failed("h", f"k{i}", raised, object()) is None for i in range(20))


class Unavailable(Exception):
    systemic = True


class Invalid(Exception):
    systemic = False


def test_an_exception_type_marks_itself_systemic_or_the_record_s_own() -> None:
    b, _ = breaker(after_keys=3)
    verdict = b.failed("h", "k1", Unavailable("payments down"), object())
    assert verdict is not None
    assert verdict.certain  # at once, on the first key
    assert verdict.reason == "handler h cannot run: Unavailable: payments down"
    assert all(b.failed("h", f"k{i}", Invalid("bad"), object()) is None for i in range(20))
    marked = ConnectionError("refused")
    marked.systemic = False  # type: ignore[attr-defined]  # an instance attribute will do
    assert all(b.failed("h", f"k{i}", marked, object()) is None for i in range(20))
    # the outermost mark wins: the handler says this table error is the record's
    refused = Invalid("no ledger for this tenant")
    refused.__cause__ = asyncpg.UndefinedTableError('relation "ledger_42" does not exist')
    assert b.failed("h", "k", refused, object()) is None
    missing = RuntimeError("could not save")
    missing.__cause__ = Unavailable("the ledger service")
    assert b.failed("h", "k", missing, object()) is not None


def streak_stall(b: Breaker, *records: object) -> Verdict:
    """``records`` fail alike on keys of their own: the last one stalls and probes."""
    *first, last = records
    for i, record in enumerate(first):
        assert b.failed("h", f"k{i}", ValueError("refused"), record) is None
    verdict = b.failed("h", "last", ValueError("refused"), last)
    assert verdict is not None
    assert not verdict.certain
    assert b.stall(last, verdict) is not None
    return verdict


async def test_a_streak_every_waiting_record_failed_lets_a_new_one_probe_and_end_it() -> None:
    b, told = breaker(after_keys=3)
    bad = [object() for _ in range(3)]
    verdict = streak_stall(b, *bad)
    waiting = [asyncio.create_task(b.turn(r, asyncio.Event())) for r in bad[:2]]
    await asyncio.sleep(0)
    assert not b.holding()  # all three have tried and failed: new records may come
    fresh = object()
    new = asyncio.create_task(b.turn(fresh, asyncio.Event()))
    await asyncio.sleep(0)
    assert b.holding()  # a record not yet tried waits: it probes next
    back = asyncio.create_task(b.turn(bad[2], asyncio.Event()))  # the probe comes back
    assert await asyncio.wait_for(new, 5) is True
    assert b.probe is fresh  # not the longest waiting: the one not yet tried
    b.resolved(fresh)  # it got through: the others failed each for a reason of its own
    b.succeeded("h", fresh)  # and was applied (the pipeline tells both)
    assert await asyncio.wait_for(asyncio.gather(back, *waiting), 5) == [True] * 3
    assert told.reasons == [verdict.reason, None]
    for i, record in enumerate(bad * 3):  # judged one by one now: no stall again
        assert b.failed("h", f"k{i}", ValueError("refused"), record) is None
    assert b.failed("h", "x", asyncpg.UndefinedTableError("x"), bad[0]) is not None
    other = [object() for _ in range(3)]  # records not acquitted still make a streak
    assert [b.failed("h", f"o{i}", ValueError("refused"), r) is None
            for i, r in enumerate(other)] == [True, True, False]


async def test_a_new_record_failing_alike_keeps_the_stall_and_nothing_is_acquitted() -> None:
    b, told = breaker(after_keys=2)
    first, probe, fresh = object(), object(), object()
    verdict = streak_stall(b, first, probe)
    assert not b.holding()  # both have tried: new records may come
    new = asyncio.create_task(b.turn(fresh, asyncio.Event()))
    await asyncio.sleep(0)
    back = asyncio.create_task(b.turn(probe, asyncio.Event()))  # hands over to the new one
    assert await asyncio.wait_for(new, 5) is True
    again = b.failed("h", "fresh", ValueError("refused"), fresh)
    assert again is not None
    assert b.stall(fresh, again) is not None  # a service down for every key: still stalled
    assert b.reason == verdict.reason
    assert not b.holding()
    returned = asyncio.create_task(b.turn(fresh, asyncio.Event()))
    assert await asyncio.wait_for(back, 5) is True  # the one that waited longest tries
    assert b.probe is probe
    b.resolved(probe)  # a record that failed before gets through: the service is back
    assert await asyncio.wait_for(returned, 5) is True
    assert told.reasons == [verdict.reason, None]
    for record in (first, probe, fresh):  # not acquitted: their failures still count
        assert b.failed("h", "k9", ValueError("refused"), record) is not None


async def test_a_stall_a_cause_vouches_for_holds_new_records_and_every_handler() -> None:
    b, _ = breaker()
    first, second = object(), object()
    b.stall(first, MISSING)
    b.stall(second, MISSING)
    waiting = asyncio.create_task(b.turn(second, asyncio.Event()))
    await asyncio.sleep(0)
    assert b.holding()  # every record has tried, but a missing table stays missing
    assert b.blocks("h")
    assert b.blocks("g")
    b.succeeded("h", object())  # a record applied in a batch begun before: no proof
    assert b.reason == MISSING.reason
    b.resolved(first)
    assert await asyncio.wait_for(waiting, 5) is True


async def test_a_streak_s_stall_holds_only_its_handler_and_a_batch_success_ends_it() -> None:
    b, told = breaker(after_keys=2)
    streak_stall(b, object(), object())
    assert b.blocks("h")
    assert not b.blocks("g")  # another handler's records go on
    b.succeeded("g", object())
    assert b.blocks("h")
    b.succeeded("h", object())  # a record of h applied without failing: not every record
    assert (b.reason, b.probe) == (None, None)
    assert told.reasons[-1] is None


async def test_a_record_done_is_forgotten_and_the_stall_goes_on_without_it() -> None:
    b, _ = breaker(after_keys=2)
    first, probe, other = object(), object(), object()
    streak_stall(b, first, probe)
    waiting = asyncio.create_task(b.turn(other, asyncio.Event()))
    await asyncio.sleep(0)
    b.done(first)  # settled, revoked or stopping while the stall goes on
    b.done(probe)
    assert await asyncio.wait_for(waiting, 5) is True
    assert b.probe is other
    assert b.reason is not None
    remembered = [*b._tried.values(), *b._alone.values(),
                  *(r for streak in b._streaks.values() for r in streak.records.values())]
    assert first not in remembered
    assert probe not in remembered  # nothing kept of a record once it is done


@pytest.mark.parametrize("error", [
    asyncpg.OutOfMemoryError("out of shared memory"),
    asyncpg.TooManyConnectionsError("sorry, too many clients already"),
    asyncpg.DiskFullError("could not extend file: No space left on device"),
    asyncpg.ConfigurationLimitExceededError("too many range table entries"),
    asyncpg.InsufficientResourcesError("insufficient resources"),
])
def test_the_server_out_of_resources_is_an_outage_not_a_handler_failure(
    error: Exception,
) -> None:
    assert judge(error) == (error, True)  # in the claim
    assert judge(HandlerFailure(error)) == (error, True)  # in the handler's statement
    wrapped = RuntimeError("could not save")
    wrapped.__cause__ = error
    assert judge(HandlerFailure(wrapped)) == (wrapped, True)
    decided = DeadLetter("given up")  # the handler's own decision stands
    decided.__cause__ = error
    assert judge(HandlerFailure(decided)) == (decided, False)


def test_a_cancelled_statement_is_nobody_s_failure_only_while_stopping() -> None:
    cancelled = asyncpg.QueryCanceledError("canceling statement due to user request")
    assert judge(HandlerFailure(cancelled)) == (cancelled, False)  # a statement_timeout, say
    assert judge(HandlerFailure(cancelled), stopping=True) == (cancelled, True)
    assert judge(cancelled, stopping=True) == (cancelled, True)


async def test_a_duplicate_probe_ends_the_stall_but_acquits_nobody() -> None:
    b, told = breaker(after_keys=3)
    bad = [object() for _ in range(3)]
    verdict = streak_stall(b, *bad)
    waiting = [asyncio.create_task(b.turn(r, asyncio.Event())) for r in bad[:2]]
    await asyncio.sleep(0)
    fresh = object()
    new = asyncio.create_task(b.turn(fresh, asyncio.Event()))
    await asyncio.sleep(0)
    back = asyncio.create_task(b.turn(bad[2], asyncio.Event()))
    assert await asyncio.wait_for(new, 5) is True
    b.resolved(fresh, ran=False)  # a redelivered duplicate: its handler never ran
    assert await asyncio.wait_for(asyncio.gather(back, *waiting), 5) == [True] * 3
    assert told.reasons == [verdict.reason, None]
    # the service may still be down: the failed records are not judged alone, and the
    # streak they made (no record of the handler was applied) stalls again at once
    assert b.failed("h", "k0", ValueError("refused"), bad[0]) is not None


async def test_a_new_stall_takes_back_the_last_one_s_acquittals() -> None:
    b, _ = breaker(after_keys=3)
    bad = [object() for _ in range(3)]
    streak_stall(b, *bad)
    fresh = object()
    b.probe = fresh  # the record not yet tried probes, and gets through
    b.resolved(fresh)
    b.succeeded("h", fresh)  # and was applied (the pipeline tells both)
    assert all(b.failed("h", f"k{i}", ValueError("refused"), r) is None
               for i, r in enumerate(bad))  # acquitted: each judged alone
    streak_stall(b, *[object() for _ in range(3)])  # new keys fail alike: down after all
    # the acquitted record's next failure is the stall's again: it waits, spending nothing
    assert b.failed("h", "k0", ValueError("refused"), bad[0]) is not None
    assert b.blocks("h")


def test_a_row_no_partition_takes_stalls_though_postgresql_calls_it_a_check() -> None:
    b, _ = breaker()
    missing = asyncpg.CheckViolationError(
        'no partition of relation "outbox" found for row')
    verdict = b.failed("h", "k", missing)
    assert verdict is not None
    assert verdict.certain
    assert b.failed("h", "k", asyncpg.CheckViolationError(
        'new row for relation "items" violates check constraint "items_n_check"')) is None
