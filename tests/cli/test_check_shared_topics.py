"""``consumerkit check MODULE:ATTR`` samples the last records of each partition of the
consumer's topics, without a group and without committing: it names the event types no handler
takes (a problem when they would be dead-lettered, a note when skipped), and a handler whose
event type never appears beside one close to it that does (a misspelt handler)."""

from __future__ import annotations

import asyncio

import pytest

from consumerkit.cli import main
from consumerkit.testing.services import MakeTopic

from ..integration.ledger import publish_raw
from ..integration.shared_topic import records
from ..integration.test_offset_store import committed

APP = "tests.integration.shared_topic"


async def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = await asyncio.to_thread(main, list(argv))  # the CLI runs its own event loop
    out = capsys.readouterr()
    return code, out.out + out.err


async def test_check_names_the_unhandled_types_and_a_misspelt_handler(
    postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic, pg_schema: str,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = await make_topic(partitions=1)
    await publish_raw(kafka_bootstrap, topic, records(3))  # o-0, o-1, o-2, five types each
    monkeypatch.setenv("SHARED_TEST_TOPIC", topic)
    monkeypatch.setenv("SHARED_TEST_SCHEMA", pg_schema)
    services = ["--postgres", postgres_dsn, "--schema", pg_schema, "--kafka", kafka_bootstrap,
                "--min-replication", "1"]
    assert (await run(capsys, "migrate", *services[:4]))[0] == 0
    what = f"topic {topic} (last 5 per partition, 5 records)"
    seen = "order.cancelled (1), order.internal.audit (1), order.shipped (1)"

    code, out = await run(capsys, "check", f"{APP}:dead_lettering", *services, "--sample", "5")
    assert code == 1, out
    assert (f"PROBLEM  {what}: event types no handler takes, dead-lettered: {seen}; handle "
            "them, or skip them with Unhandled(policy='skip') or Unhandled(ignore=[...]) "
            "(--unhandled-policy, --unhandled-ignore)") in out.splitlines()

    code, out = await run(capsys, "check", f"{APP}:skipping", *services, "--sample", "5")
    assert code == 0, out
    assert f"note     {what}: event types no handler takes, skipped: {seen}" in out.splitlines()

    code, out = await run(capsys, "check", f"{APP}:misspelt", *services, "--sample", "5")
    assert code == 1, out
    assert (f"PROBLEM  handler {APP}.take_order_craeted takes event type 'order.craeted', "
            "never seen in the sample, but 'order.created' is (1 record, no handler): misspelt?"
            ) in out.splitlines()
    # the settings reach the check as they reach `consumerkit run`
    code, out = await run(capsys, "check", f"{APP}:dead_lettering", *services, "--sample", "5",
                          "--unhandled-policy", "skip")
    assert code == 0, out
    assert await committed(kafka_bootstrap, "inventory", topic, 1) == {}  # no group offsets
