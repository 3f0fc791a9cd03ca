"""Handlers written under postponed annotations, resolved at registration."""

from __future__ import annotations

from pydantic import BaseModel

from consumerkit import HandlerContext, handler


class OrderCreated(BaseModel):
    order_id: str
    amount: int


@handler("order.created")
async def charge(event: OrderCreated, ctx: HandlerContext) -> None:
    await ctx.tx.execute("SELECT 1")


@handler("order.cancelled")
async def cancel(event: Undefined, ctx: HandlerContext) -> None:  # type: ignore[name-defined]  # noqa: F821
    del event, ctx
