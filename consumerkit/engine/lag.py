"""Consumer lag, kept current while the consumer runs: per assigned partition, the broker's
end offset minus the offset committed (by this member, or before it on the broker).

End offsets are asked every ``interval`` seconds in one request, never per message. Checked
against Tansu with aiokafka 0.14: its end offset is one past the first offset of the newest
record batch, not of the newest record, so the end used is the larger of that and one past
the last record this member handed out (a real Kafka broker's end offset is never below the
latter). The lag falls to 0 once every fetched record is committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ..errors import TransportError
from ..observability.observer import Observer
from ..transport.source import Partition, Source
from .runner import Engine

log = logging.getLogger("consumerkit.consumer")


async def track_lag(engine: Engine, source: Source, observer: Observer,
                    interval: float) -> None:
    """Report every partition's lag to ``observer`` each ``interval`` until cancelled."""
    warned = False
    while True:
        try:
            await report_lag(engine, source, observer)
            warned = False
        except (TransportError, TimeoutError) as exc:
            if not warned:
                log.warning("cannot measure consumer lag (%s); retrying every %.0fs", exc,
                            interval)
                warned = True
        except Exception:  # the metric must never stop the consumer
            log.exception("measuring consumer lag failed")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(interval):
                await engine.stopping.wait()
                return


async def report_lag(engine: Engine, source: Source, observer: Observer) -> None:
    states = dict(engine.states)
    if not states:
        return
    async with asyncio.timeout(10):
        ends = await source.end_offsets(list(states))
        for part, end in ends.items():
            state = states[part]
            committed = state.offsets.committed
            if committed is None:  # nothing committed by this member yet: the broker's
                committed = await _committed(source, part)
            if engine.states.get(part) is state:  # still ours
                observer.lag(part[0], part[1], max(0, max(end, state.fetched or 0) - committed))


async def _committed(source: Source, part: Partition) -> int:
    off = await source.committed(part)
    return off if off is not None else 0
