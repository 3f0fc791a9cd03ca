"""After a lane fails the consumer drains: the first SIGTERM during that drain still means
"finish in-flight work" (a second one forces), not "abandon it now"."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from pydantic import BaseModel

from consumerkit import HandlerContext, Limits, Postgres, handler
from consumerkit.observability.tracing import Tracing
from consumerkit.testing import TestConsumer


class Job(BaseModel):
    name: str


class BrokenTracer:
    """Fails to start the span of the message keyed ``broken``: a fault in a built-in
    observer, which breaks that message's lane."""

    def __init__(self, tracer: Any) -> None:
        self.tracer = tracer

    def start_span(self, name: str, **options: Any) -> Any:
        if options["attributes"].get("messaging.kafka.message.key") == "broken":
            raise RuntimeError("tracer broke")
        return self.tracer.start_span(name, **options)


class BrokenProvider:
    def __init__(self) -> None:
        self.provider = TracerProvider()

    def get_tracer(self, *args: Any, **kwargs: Any) -> BrokenTracer:
        return BrokenTracer(self.provider.get_tracer(*args, **kwargs))


async def test_the_first_signal_after_a_lane_failure_drains_in_flight_work(
    consumerkit_dsn: str, consumerkit_schema: str, caplog: pytest.LogCaptureFixture,
) -> None:
    running, release = asyncio.Event(), asyncio.Event()

    @handler("job.run")
    async def work(event: Job, ctx: HandlerContext) -> None:
        if event.name == "slow":
            running.set()
            await release.wait()

    kit = TestConsumer([work],
                       postgres=Postgres(dsn=consumerkit_dsn, schema=consumerkit_schema),
                       limits=Limits(max_batch=1),
                       observers=[Tracing(tracer_provider=BrokenProvider())])
    kit.consumer.handle_signals = True  # read when run() starts
    await kit.start()
    task = kit._task
    assert task is not None
    try:
        kit.publish(Job(name="slow"), key="slow")
        async with asyncio.timeout(30):
            await running.wait()
            kit.publish(Job(name="broken"), key="broken")
            while await kit.consumer.readiness() != "stopping":  # the lane failed: draining
                await asyncio.sleep(0.01)
        assert not task.done()  # the slow handler holds the drain
        with caplog.at_level(logging.INFO, logger="consumerkit.consumer"):
            signal.raise_signal(signal.SIGTERM)
            async with asyncio.timeout(30):
                while "SIGTERM" not in caplog.text:
                    await asyncio.sleep(0.01)
        assert "finishing in-flight work" in caplog.text
        assert "abandoning" not in caplog.text
        release.set()
        with pytest.raises(RuntimeError, match="tracer broke"):
            await task  # the lane's failure ends the run, once the drain is over
    finally:
        release.set()
        await kit.stop()
    assert kit.stats.applied == 1  # the slow message finished, not cut short
    assert kit.stats.abandoned == 0
