"""The coalescer: concurrent requests share round trips, one round trip out at a time."""

from __future__ import annotations

import asyncio

import pytest

from consumerkit.dedup.coalesce import Closed, Coalescer


class Echo:
    """A send that answers each line with its length and records every round trip; it can be
    held open to let requests pile up behind it."""

    def __init__(self) -> None:
        self.trips: list[list[bytes]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.out = 0
        self.most_out = 0

    async def __call__(self, payloads: list[bytes], count: int) -> list[int]:
        self.trips.append(payloads)
        self.out += 1
        self.most_out = max(self.most_out, self.out)
        try:
            await self.gate.wait()
        finally:
            self.out -= 1
        answers = [len(line) for p in payloads for line in p.split(b"\n")]
        assert len(answers) == count
        return answers


def _payload(*lines: str) -> tuple[bytes, int]:
    return "\n".join(lines).encode(), len(lines)


async def test_a_lone_request_goes_at_once_and_alone() -> None:
    send = Echo()
    coalescer: Coalescer[int] = Coalescer(send)
    assert await coalescer.ask(*_payload("a", "bb")) == [1, 2]
    assert await coalescer.ask(*_payload("ccc")) == [3]
    assert send.trips == [[b"a\nbb"], [b"ccc"]]


async def test_requests_made_while_one_is_out_share_the_next_round_trip() -> None:
    send = Echo()
    send.gate.clear()
    coalescer: Coalescer[int] = Coalescer(send)
    first = asyncio.create_task(coalescer.ask(*_payload("x")))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(send.trips) == 1  # out, and held
    rest = [asyncio.create_task(coalescer.ask(*_payload("y" * n, "z"))) for n in range(1, 301)]
    await asyncio.sleep(0)
    send.gate.set()
    assert await first == [1]
    answers = await asyncio.gather(*rest)
    assert answers == [[n, 1] for n in range(1, 301)]  # each caller gets its own answers
    assert len(send.trips) == 2  # 300 requests, 600 items, one round trip
    assert send.most_out == 1
    assert coalescer.round_trips == 2


async def test_round_trips_hold_about_max_items() -> None:
    send = Echo()
    send.gate.clear()
    coalescer: Coalescer[int] = Coalescer(send, max_items=10)
    tasks = [asyncio.create_task(coalescer.ask(*_payload("a", "b", "c"))) for _ in range(7)]
    big = asyncio.create_task(coalescer.ask(*_payload(*"abcdefghijklmno")))
    await asyncio.sleep(0)
    send.gate.set()
    await asyncio.gather(*tasks, big)
    # at most 10 items a trip, in the order asked; a larger request goes alone
    assert [sum(p.count(b"\n") + 1 for p in trip) for trip in send.trips] == [9, 9, 3, 15]


async def test_a_caller_that_gives_up_leaves_the_others_their_answers() -> None:
    send = Echo()
    send.gate.clear()
    coalescer: Coalescer[int] = Coalescer(send)
    first = asyncio.create_task(coalescer.ask(*_payload("a")))
    await asyncio.sleep(0)
    quitter = asyncio.create_task(coalescer.ask(*_payload("bb")))
    stayer = asyncio.create_task(coalescer.ask(*_payload("ccc")))
    await asyncio.sleep(0)
    quitter.cancel()
    send.gate.set()
    assert await first == [1]
    assert await stayer == [3]
    with pytest.raises(asyncio.CancelledError):
        await quitter
    assert send.trips[1] == [b"ccc"]  # the cancelled request was dropped unsent


async def test_a_send_that_raises_fails_its_callers_and_not_the_next() -> None:
    calls = 0

    async def flaky(payloads: list[bytes], count: int) -> list[int]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ValueError("broken")
        return [0] * count if calls == 2 else [0]  # the third answers too few

    coalescer: Coalescer[int] = Coalescer(flaky)
    with pytest.raises(ValueError, match="broken"):
        await coalescer.ask(*_payload("a"))
    assert await coalescer.ask(*_payload("a", "b")) == [0, 0]
    with pytest.raises(RuntimeError, match="1 answers for 2 items"):
        await coalescer.ask(*_payload("a", "b"))


async def test_close_answers_what_waits_with_closed() -> None:
    """Callers are not cancelled by another's close: they get Closed (the cache turns that
    into "nothing known"), and so does any later call."""
    send = Echo()
    send.gate.clear()
    coalescer: Coalescer[int] = Coalescer(send)
    out = asyncio.create_task(coalescer.ask(*_payload("a")))
    await asyncio.sleep(0)
    waiting = asyncio.create_task(coalescer.ask(*_payload("b")))
    await asyncio.sleep(0)
    await coalescer.close()
    for task in (out, waiting):
        with pytest.raises(Closed):
            await task
    with pytest.raises(Closed):
        await coalescer.ask(*_payload("c"))
    with pytest.raises(ValueError, match="max_items"):
        Coalescer(send, max_items=0)
