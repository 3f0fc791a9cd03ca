"""A consumer for the settings tests, loaded by MODULE:ATTR from the current directory: its
code passes only the arguments named in ``$CLI_TEST_CHOSEN`` (a JSON object) besides its name,
handler and topic, and leaves every other one at its default for the settings to give."""

from __future__ import annotations

import json
import os
from typing import Any

from pydantic import BaseModel

from consumerkit import Consumer, HandlerContext, Kafka, handler
from consumerkit.settings.groups import GROUPS

TABLE = os.environ.get("CLI_TEST_SCHEMA", "consumerkit")
FAST_GROUP = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 300,
              "rebalance_timeout_ms": 3000, "metadata_max_age_ms": 2000}


class Charge(BaseModel):
    order_id: str
    amount: int


@handler("charge")
async def charge(event: Charge, ctx: HandlerContext) -> None:
    await ctx.tx.execute(f'INSERT INTO "{TABLE}".charges (order_id, amount) VALUES ($1, $2)',
                         event.order_id, event.amount)


def build() -> Consumer:
    # what the code chooses: {"limits": {"max_batch": 500}} or {"offset_store": "kafka"}
    chosen = json.loads(os.environ.get("CLI_TEST_CHOSEN", "{}"))
    options: dict[str, Any] = {
        name: GROUPS[name](**fields) if name in GROUPS else fields
        for name, fields in chosen.items()}
    options["kafka"] = Kafka(consumer_options=FAST_GROUP, **chosen.get("kafka", {}))
    return Consumer(name=os.environ.get("CLI_TEST_GROUP", "cli-defaults"), handlers=[charge],
                    topics=[os.environ.get("CLI_TEST_TOPIC", "orders")], **options)
