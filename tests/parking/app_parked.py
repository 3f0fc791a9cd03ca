"""A consumer for the ``consumerkit parked replay`` tests, loaded by MODULE:ATTR from the
current directory: it appends each step to the ledger of ``$PARKED_TEST_SCHEMA``."""

from __future__ import annotations

import os

from pydantic import BaseModel

from consumerkit import Consumer, HandlerContext, Postgres, handler

SCHEMA = os.environ.get("PARKED_TEST_SCHEMA", "consumerkit")


class Step(BaseModel):
    key: str
    seq: int


@handler("step.recorded", on_exhausted="park")
async def record_step(event: Step, ctx: HandlerContext) -> None:
    await ctx.tx.execute(
        f'INSERT INTO "{SCHEMA}".ledger (event_id, key, seq) VALUES ($1, $2, $3)',
        ctx.envelope.event_id, event.key, event.seq)


consumer = Consumer(name="parked-app", handlers=[record_step], topics=["steps"],
                    postgres=Postgres(schema=SCHEMA),
                    handle_signals=False)
