"""A topic shared by five order event types and consumers that handle two of them: the
records, and the consumers (also loaded by MODULE:ATTR in the ``consumerkit check`` tests,
which give the topic and schema in ``$SHARED_TEST_TOPIC`` and ``$SHARED_TEST_SCHEMA``)."""

from __future__ import annotations

import os
from typing import Any

import orjson
from pydantic import BaseModel

from consumerkit import Consumer, HandlerContext, HandlerRegistry, Kafka, Postgres, Unhandled

from ..pooling import POOLER
from .ledger import merge_options

TYPES = ("order.created", "order.paid", "order.shipped", "order.cancelled",
         "order.internal.audit")
HANDLED = ("order.created", "order.paid")
UNHANDLED = ("order.cancelled", "order.internal.audit", "order.shipped")  # sorted
FAST_GROUP = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 300,
              "rebalance_timeout_ms": 5000}


class Order(BaseModel):
    order_id: str


Record = tuple[bytes, bytes, list[tuple[str, bytes]]]


def records(per_type: int) -> list[Record]:
    """``per_type`` orders, each through the five event types in turn (key: the order)."""
    return [(f"o-{n}".encode(), orjson.dumps({"order_id": f"o-{n}"}),
             [("id", f"{t}/o-{n}".encode()), ("event_type", t.encode())])
            for n in range(per_type) for t in TYPES]


def registry(types: tuple[str, ...], taken: list[str] | None = None) -> HandlerRegistry:
    handlers = HandlerRegistry()
    for event_type in types:
        async def take(event: Order, ctx: HandlerContext) -> None:
            if taken is not None:
                taken.append(ctx.envelope.event_id)

        take.__name__ = take.__qualname__ = "take_" + event_type.replace(".", "_")
        handlers.handler(event_type)(take)
    return handlers


def consumer(name: str, topic: str, schema: str, types: tuple[str, ...] = HANDLED,
             taken: list[str] | None = None, **settings: Any) -> Consumer:
    return Consumer(name=name, **merge_options({
        "handlers": [registry(types, taken)], "topics": [topic],
        "postgres": Postgres(schema=schema, pooler=POOLER),
        "kafka": Kafka(consumer_options=FAST_GROUP), "handle_signals": False}, settings))


def _env() -> tuple[str, str]:
    return os.environ["SHARED_TEST_TOPIC"], os.environ["SHARED_TEST_SCHEMA"]


def skipping() -> Consumer:
    return consumer("inventory", *_env(), unhandled=Unhandled(policy="skip"))


def dead_lettering() -> Consumer:
    return consumer("inventory", *_env())


def misspelt() -> Consumer:
    return consumer("inventory", *_env(), types=("order.craeted", "order.paid"),
                    unhandled=Unhandled(policy="skip"))
