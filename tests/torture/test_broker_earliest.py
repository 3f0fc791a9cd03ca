"""The broker keeps every batch of concurrent first appends at the offsets it acknowledged,
so a reader from offset 0 (``tests/harness/from_zero.py``) reads them all, whatever the
broker names as the beginning (``python -m tests.torture.broker_earliest``)."""

from __future__ import annotations

from .broker_earliest import PARTITIONS, run_on


async def test_a_reader_from_offset_0_reads_every_concurrent_first_append(
    kafka_bootstrap: str,
) -> None:
    rounds = 8
    tally = await run_on(kafka_bootstrap, rounds, producers=2)
    assert tally.rounds == rounds
    assert tally.records == rounds * PARTITIONS * (6 + 7)
    assert tally.missed_from_zero == 0
