"""An observer passed in ``observers=`` that raises is a bug of its own: it is logged, and the
message it observed is still applied exactly once, its offset committed, and the consumer
goes on and stops cleanly."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import asyncpg
import pytest

from consumerkit import Postgres
from consumerkit.envelope import Envelope, RecordLike
from consumerkit.observability import BaseObserver
from consumerkit.testing import TestConsumer

from .handlers import TABLE_SQL, Step, effects, registry


class Raises(BaseObserver):
    """Raises from the methods named, counting the calls."""

    def __init__(self, *methods: str) -> None:
        self.methods = set(methods)
        self.calls: dict[str, int] = {}

    def _called(self, method: str) -> None:
        self.calls[method] = self.calls.get(method, 0) + 1
        if method in self.methods:
            raise RuntimeError(f"a bug in the observer's {method}")

    def handler_finished(self, handler: str, seconds: float) -> None:
        self._called("handler_finished")

    def applied(self, record: RecordLike, envelope: Envelope, handler: str) -> None:
        self._called("applied")

    def abandoned(self, records: Sequence[RecordLike]) -> None:
        self._called("abandoned")

    def readiness(self, role: str, name: str, reason: str | None) -> None:
        self._called("readiness")


@pytest.mark.parametrize("method", ["handler_finished", "applied", "readiness"])
async def test_a_raising_observer_changes_no_outcome_and_stops_nothing(
    method: str, consumerkit_dsn: str, consumerkit_schema: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    conn = await asyncpg.connect(consumerkit_dsn)
    try:
        await conn.execute(TABLE_SQL)
    finally:
        await conn.close()
    observer = Raises(method)
    kit = TestConsumer([registry],
                       postgres=Postgres(dsn=consumerkit_dsn, schema=consumerkit_schema),
                       observers=[observer])
    with caplog.at_level(logging.ERROR, logger="consumerkit.observer"):
        async with kit:
            assert await kit.consumer.readiness() is None  # told to the observer: raises
            for n in range(8):
                kit.publish(Step(key=f"k{n % 3}", seq=n), key=f"k{n % 3}")
            await kit.drain()
            assert kit.stats.applied == 8
            assert kit.dead_letters == []
            assert sorted(await effects(consumerkit_dsn)) == sorted(
                (f"k{n % 3}", n) for n in range(8))
            ends = kit.broker.end_offsets("events")
            assert kit.committed == {p: end for p, end in ends.items() if end}
            task = kit._task
            assert task is not None
            assert not task.done()
            kit.publish(Step(key="late", seq=99), key="late")
            await kit.drain()
            assert kit.stats.applied == 9
        assert task.done()
        assert task.exception() is None
    assert observer.calls[method] >= 1
    failures = [r for r in caplog.records if r.name == "consumerkit.observer"]
    assert len(failures) == 1  # logged once, not once per call
    assert f"Raises.{method} raised" in failures[0].getMessage()
