"""A consumer for the ``consumerkit dead-letters replay`` tests, loaded by MODULE:ATTR from the
current directory: it appends each event to the ledger of ``$DEAD_TEST_SCHEMA``, taking
``$DEAD_TEST_DELAY`` seconds per event (so that a test can kill a replay half-way)."""

from __future__ import annotations

import asyncio
import os

from pydantic import BaseModel

from consumerkit import Consumer, HandlerContext, Postgres, handler

SCHEMA = os.environ.get("DEAD_TEST_SCHEMA", "consumerkit")
DELAY = float(os.environ.get("DEAD_TEST_DELAY", "0"))


class Step(BaseModel):
    key: str
    seq: int


@handler("step.recorded")
async def record_step(event: Step, ctx: HandlerContext) -> None:
    await ctx.tx.execute(
        f'INSERT INTO "{SCHEMA}".ledger (event_id, key, seq) VALUES ($1, $2, $3)',
        ctx.envelope.event_id, event.key, event.seq)
    if DELAY:
        await asyncio.sleep(DELAY)


consumer = Consumer(name="dead-app", handlers=[record_step], topics=["steps"],
                    postgres=Postgres(schema=SCHEMA),
                    handle_signals=False)
