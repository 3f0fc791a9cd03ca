import asyncio
import os
import signal

from consumerkit.shared import signals


async def test_one_signal_reaches_every_consumer_and_the_default_comes_back() -> None:
    seen: list[tuple[str, signal.Signals]] = []
    both = asyncio.Event()

    def first(sig: signal.Signals) -> None:
        seen.append(("first", sig))

    def second(sig: signal.Signals) -> None:
        seen.append(("second", sig))
        both.set()

    remove_first = signals.install(first)
    remove_second = signals.install(second)
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(both.wait(), 5)
    assert seen == [("first", signal.SIGTERM), ("second", signal.SIGTERM)]
    remove_first()
    assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)  # second still on
    remove_second()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
