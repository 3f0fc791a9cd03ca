"""``consumerkit dead-letters`` as a person runs it: a replay killed half-way and run again,
a dry run, show, discard, the listing, a replay refused while another runs, and one line for
each mistake."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import asyncpg
import pytest

from consumerkit import Consumer, HandlerContext, Postgres, replay_dead_letters
from consumerkit.deadletter.table import TABLE
from consumerkit.shared.identifiers import qualified

from ..cli.conftest import cli, finish, start
from ..integration.ledger import Step, ledger_handler, ledger_rows, verify
from .conftest import APP, Letter, bury, letters, statuses

REPLAY = ("dead-letters", "replay", "--app", "app_dead_letters:consumer")


async def _snapshot(pool: asyncpg.Pool, schema: str) -> list[asyncpg.Record]:
    return list(await pool.fetch(f"SELECT * FROM {qualified(schema, TABLE)} ORDER BY id"))


async def test_a_replay_killed_half_way_and_run_again_applies_each_entry_once(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool, app_dir: Path,
) -> None:
    buried = letters(keys=40, per_key=25)
    await bury(pg_pool, pg_schema, buried)
    env = {"DEAD_TEST_SCHEMA": pg_schema, "DEAD_TEST_DELAY": "0.01"}
    proc = await start(*REPLAY, "--postgres", postgres_dsn, "--note", "first try",
                       cwd=app_dir, env=env)
    deadline = time.monotonic() + 60
    while (await statuses(pg_pool, pg_schema)).get("replayed", 0) < 100:
        assert proc.returncode is None, "the replay ended before it could be killed"
        assert time.monotonic() < deadline, "no entry replayed within 60 s"
        await asyncio.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    killed = await finish(proc)
    assert killed.code == -signal.SIGKILL
    counts = await statuses(pg_pool, pg_schema)
    assert 100 <= counts["replayed"] < len(buried), counts
    async with pg_pool.acquire() as conn:  # the effects and the marks committed together
        assert len(await ledger_rows(conn, pg_schema)) == counts["replayed"]
    again = await cli(*REPLAY, "--postgres", postgres_dsn, cwd=app_dir,
                      env={"DEAD_TEST_SCHEMA": pg_schema})
    assert again.code == 0, again.output
    rest = len(buried) - counts["replayed"]
    assert again.out.strip() == (
        f"{rest} dead letters: {rest} replayed, 0 applied before (marked replayed), 0 failed "
        "again (kept waiting), 0 held back behind an earlier entry of their key, 0 replayed or "
        "discarded meanwhile")
    async with pg_pool.acquire() as conn:
        verify(await ledger_rows(conn, pg_schema), [b.event for b in buried])
    assert await statuses(pg_pool, pg_schema) == {"replayed": len(buried)}


async def test_a_dry_run_decodes_and_tries_the_handlers_and_writes_nothing(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool, app_dir: Path,
) -> None:
    buried = letters(keys=2, per_key=2, partitions=1)
    bad = Letter(buried[0].event.__class__("evt-bad", "key-9", 1), 0, 99, value=b"{not json")
    await bury(pg_pool, pg_schema, [*buried, bad])
    before = await _snapshot(pg_pool, pg_schema)
    done = await cli(*REPLAY, "--postgres", postgres_dsn, "--dry-run", "--try-handlers",
                     cwd=app_dir, env={"DEAD_TEST_SCHEMA": pg_schema})
    assert done.code == 1, done.output  # one would fail
    lines = done.out.splitlines()
    assert lines[0].startswith("#1 steps/0/0: ok, handler ")
    assert "1 statement checked, none refused" in lines[0]
    assert lines[4].startswith("#5 steps/0/99: would fail: invalid_json: ")
    assert lines[-1] == ("dry run: 5 dead letters, 4 would be replayed, 1 would fail; "
                         "nothing was written")
    assert await _snapshot(pg_pool, pg_schema) == before
    async with pg_pool.acquire() as conn:
        assert await ledger_rows(conn, pg_schema) == []
    wrong = await cli(*REPLAY, "--postgres", postgres_dsn, "--try-handlers", cwd=app_dir,
                      env={"DEAD_TEST_SCHEMA": pg_schema})
    assert (wrong.code, wrong.output.strip()) == (
        1, "consumerkit: --try-handlers goes with --dry-run")


async def test_list_show_and_discard_are_audited_and_escaped(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool, app_dir: Path,
) -> None:
    forged = Letter(letters(1, 1)[0].event.__class__(
        "evt-\x1b[2J", "key-0", 1, headers=(("note", b"line\nforged\x1b]0;x\x07"),)), 0, 0)
    await bury(pg_pool, pg_schema, [forged, *letters(keys=2, per_key=2, partitions=2)[1:]])
    db = ["--postgres", postgres_dsn, "--schema", pg_schema]
    shown = await cli("dead-letters", "show", "1", *db, cwd=app_dir)
    assert shown.code == 0, shown.output
    assert "\x1b" not in shown.out
    assert "event id: evt-\\x1b[2J" in shown.out
    assert "  note: line\\nforged\\x1b]0;x\\x07" in shown.out
    assert '    "key": "key-0",' in shown.out  # the payload, decoded and indented
    refused = await cli("dead-letters", "discard", *db, cwd=app_dir)
    assert refused.code == 1
    assert refused.output.startswith("consumerkit: discard needs at least one filter")
    dropped = await cli("dead-letters", "discard", "--id", "1", "--id", "2", "--note",
                        "bad import", *db, cwd=app_dir)
    assert (dropped.code, dropped.out.strip()) == (
        0, "discarded 2 dead letters (kept, marked discarded)")
    listed = await cli("dead-letters", *db, cwd=app_dir)
    assert listed.out.splitlines()[-1] == "2 dead letters waiting"
    everything = await cli("dead-letters", "list", "--all", *db, cwd=app_dir)
    assert everything.out.splitlines()[-1] == "4 dead letters"
    assert everything.out.count("[discarded by ") == 2
    rows = await pg_pool.fetch(
        f"SELECT id, status, resolved_by = current_user AS by_role, resolution_note "
        f"FROM {qualified(pg_schema, TABLE)} ORDER BY id")
    assert [(r["id"], r["status"], r["by_role"], r["resolution_note"]) for r in rows] == [
        (1, "discarded", True, "bad import"), (2, "discarded", True, "bad import"),
        (3, "waiting", None, None), (4, "waiting", None, None)]
    shown = await cli("dead-letters", "show", "1", *db, cwd=app_dir)
    assert "note: bad import" in shown.out
    missing = await cli("dead-letters", "show", "77", *db, cwd=app_dir)
    assert (missing.code, missing.output.strip()) == (
        1, f"consumerkit: no dead letter #77 in schema {pg_schema}")


async def test_a_replay_or_a_discard_is_refused_while_a_replay_runs(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool, app_dir: Path,
) -> None:
    await bury(pg_pool, pg_schema, letters(keys=2, per_key=2, partitions=1))
    inside, release = asyncio.Event(), asyncio.Event()

    async def wait_inside(event: Step, ctx: HandlerContext) -> None:
        inside.set()
        await release.wait()

    app = Consumer(name=APP, handlers=[ledger_handler(pg_schema, wait_inside)],
                   topics=["steps"],
                   postgres=Postgres(dsn=postgres_dsn, schema=pg_schema),
                   handle_signals=False)
    running = asyncio.create_task(replay_dead_letters(app))
    try:
        await asyncio.wait_for(inside.wait(), 30)
        other = await cli(*REPLAY, "--postgres", postgres_dsn, cwd=app_dir,
                          env={"DEAD_TEST_SCHEMA": pg_schema})
        assert (other.code, other.output.strip()) == (
            1, f"consumerkit: a replay or discard of the dead letters of {APP} on steps/0 is "
               "running: try again once it has ended")
        assert "Traceback" not in other.err
        discard = await cli("dead-letters", "discard", "--consumer", APP, "--postgres",
                            postgres_dsn, "--schema", pg_schema, cwd=app_dir)
        assert discard.code == 1
        assert "is running: try again once it has ended" in discard.output
    finally:
        release.set()
        report = await asyncio.wait_for(running, 60)
    assert report.replayed == 4
    assert await statuses(pg_pool, pg_schema) == {"replayed": 4}


@pytest.mark.parametrize(("argv", "expected"), [
    (["--since", "yesterday"], "invalid time 'yesterday'"),
    (["--partition", "-1"], "must be from 0"),
])
async def test_a_bad_filter_is_one_line(argv: list[str], expected: str, app_dir: Path) -> None:
    done = await cli("dead-letters", "discard", *argv, cwd=app_dir)
    assert done.code == 2
    assert expected in done.err
    assert "Traceback" not in done.err


async def test_another_consumers_entries_or_an_unmigrated_schema_are_one_line(
    postgres_dsn: str, pg_schema: str, app_dir: Path,
) -> None:
    env = {"DEAD_TEST_SCHEMA": pg_schema}
    other = await cli(*REPLAY, "--consumer", "billing", "--postgres", postgres_dsn,
                      cwd=app_dir, env=env)
    assert (other.code, other.output.strip()) == (
        1, "consumerkit: the dead letters of consumer 'billing' are replayed through that "
           f"consumer; the app given is consumer '{APP}'")
    missing = await cli(*REPLAY, "--postgres", postgres_dsn, cwd=app_dir, env=env)
    assert missing.code == 1
    assert len(missing.output.strip().splitlines()) == 1, missing.output
    assert "does not exist: run `consumerkit migrate`" in missing.output
