"""Parking a key instead of dead-lettering a record: per handler, or for the whole consumer."""

from __future__ import annotations

from pydantic import BaseModel

from consumerkit import Consumer, HandlerContext, Kafka, Postgres, RetryPolicy, handler


class LedgerEntry(BaseModel):
    account: str
    amount: int


# A record this handler cannot apply parks its key: it and every later record of the same
# account on the partition wait, in order, for `consumerkit parked replay`; other accounts go on.
@handler("ledger.entry", on_exhausted="park")
async def post_entry(event: LedgerEntry, ctx: HandlerContext) -> None:
    await ctx.tx.execute(
        "UPDATE balances SET amount = amount + $2 WHERE account = $1",
        event.account, event.amount)


# Every handler without a choice of its own parks too; 3 attempts before parking.
retry = RetryPolicy(max_attempts=3, on_exhausted="park")


def build(kafka: str, postgres: str) -> Consumer:
    return Consumer(name="ledger", handlers=[post_entry], topics=["ledger"],
                    postgres=Postgres(dsn=postgres),
                    kafka=Kafka(bootstrap=kafka),
                    retry=retry)
