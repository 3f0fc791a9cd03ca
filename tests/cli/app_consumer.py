"""A consumer for the ``consumerkit run`` tests, loaded by MODULE:ATTR from the current
directory. Its DSN and bootstrap servers are left unset: the command's settings fill them."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from pydantic import BaseModel

from consumerkit import (
    Consumer,
    DeadLetter,
    DeadLetterTable,
    HandlerContext,
    HandlerRegistry,
    Kafka,
    Limits,
    Postgres,
    handler,
)
from consumerkit.types import SinkResources

SCHEMA = os.environ.get("CLI_TEST_SCHEMA", "consumerkit")
DELAY = float(os.environ.get("CLI_TEST_DELAY", "0"))
FAST_GROUP = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 300,
              "rebalance_timeout_ms": 3000, "metadata_max_age_ms": 2000}


class Charge(BaseModel):
    order_id: str
    amount: int


@handler("charge")
async def charge(event: Charge, ctx: HandlerContext) -> None:
    if event.amount < 0:  # the poison message of the metrics tests
        raise DeadLetter(f"a charge of {event.amount} cannot be applied")
    await ctx.tx.execute(
        f'INSERT INTO "{SCHEMA}".charges (order_id, amount) VALUES ($1, $2)',
        event.order_id, event.amount)
    if DELAY:  # holds the transaction open, so a signal finds work in flight
        await asyncio.sleep(DELAY)


registry = HandlerRegistry([charge])  # not a consumer: `consumerkit run` says so


class GatedDeadLetters(DeadLetterTable):
    """The dead-letter table, opening only once the file ``gate`` exists: holds the
    consumer's start-up there, so a test sees it not ready yet."""

    def __init__(self, gate: Path) -> None:
        super().__init__()
        self.gate = gate

    async def open(self, resources: SinkResources) -> None:
        while not self.gate.exists():
            await asyncio.sleep(0.05)
        await super().open(resources)


def build() -> Consumer:
    gate = os.environ.get("CLI_TEST_GATE")
    return Consumer(
        name=os.environ.get("CLI_TEST_GROUP", "cli-test"), handlers=[charge],
        topics=[os.environ.get("CLI_TEST_TOPIC", "orders")],
        postgres=Postgres(schema=SCHEMA),
        kafka=Kafka(consumer_options=FAST_GROUP),
        limits=Limits(max_batch=1, concurrency=4),
        dead_letter=GatedDeadLetters(Path(gate)) if gate else None)


async def build_async() -> Consumer:
    return build()


consumer = build() if "CLI_TEST_TOPIC" in os.environ else None


def nothing() -> None:
    """A function returning no consumer: `consumerkit run` says what it returned."""
