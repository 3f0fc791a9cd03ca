"""The handlers of the parking tests that run under TestConsumer: moves of a key, applied to
the ``moves`` table, failing while their ``seq`` is in :data:`BROKEN`."""

from __future__ import annotations

from pydantic import BaseModel

from consumerkit import BatchContext, DeadLetter, HandlerContext, handler

BROKEN: set[int] = set()


class Move(BaseModel):
    seq: int


@handler("move", on_exhausted="park")
async def move(event: Move, ctx: HandlerContext) -> None:
    if event.seq in BROKEN:
        raise ValueError(f"move {event.seq} cannot be applied yet")
    if event.seq < 0:
        raise DeadLetter("a negative move is never applied")  # the handler's own decision
    await ctx.tx.execute("INSERT INTO moves (key, seq) VALUES ($1, $2)",
                         ctx.envelope.key, event.seq)


@handler("move", batch=True, on_exhausted="park")
async def moves(events: list[Move], ctx: BatchContext) -> None:
    if any(e.seq in BROKEN for e in events):
        raise ValueError("a move of this call cannot be applied yet")
    for event, envelope in zip(events, ctx.envelopes, strict=True):
        ctx.defer("INSERT INTO moves (key, seq) VALUES ($1, $2)", envelope.key, event.seq)
