"""Handler control flow: ask for a retry, dead-letter at once, fail for good, and handle a
database error without losing the transaction."""

from __future__ import annotations

import asyncpg
from pydantic import BaseModel

from consumerkit import DeadLetter, HandlerContext, Retry, handler


class PaymentDeclined(Exception):
    """A business failure that no retry can fix: dead-lettered at once."""

    retriable = False


class ChargeRequested(BaseModel):
    order_id: str
    account_id: str
    amount: int
    currency: str


@handler("charge.requested")
async def charge(event: ChargeRequested, ctx: HandlerContext) -> None:
    if event.currency not in ("EUR", "USD"):
        raise DeadLetter(f"unsupported currency {event.currency!r}")
    balance = await ctx.tx.fetchval(
        "SELECT balance FROM accounts WHERE account_id = $1 FOR UPDATE", event.account_id)
    if balance is None:
        # the account event has not arrived yet: try again in 5 s (this counts as an attempt)
        raise Retry(delay=5.0, reason=f"account {event.account_id} not found yet")
    if balance < event.amount:
        raise PaymentDeclined(f"balance {balance} < {event.amount}")
    await ctx.tx.execute(
        "UPDATE accounts SET balance = balance - $2 WHERE account_id = $1",
        event.account_id, event.amount)


class CouponApplied(BaseModel):
    order_id: str
    code: str


@handler("coupon.applied")
async def apply_coupon(event: CouponApplied, ctx: HandlerContext) -> None:
    try:
        # a savepoint: if this statement fails, only the savepoint rolls back
        async with ctx.tx.transaction():
            await ctx.tx.execute(
                "INSERT INTO coupon_uses (code, order_id) VALUES ($1, $2)",
                event.code, event.order_id)
    except asyncpg.UniqueViolationError:
        ctx.log.info("coupon %s was already used", event.code)
        return
    await ctx.tx.execute(
        "UPDATE orders SET discounted = true WHERE order_id = $1", event.order_id)
