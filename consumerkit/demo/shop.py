"""The pizza shop: its tables, its events, and the handlers of billing, inventory and the shop.

Every table of one run lives in the schema ``pizza_<run>``, consumerkit's own tables included,
so runs never see each other's rows. Each order's events carry ``seq``, the order's own
sequence (1, 2, ...); every handler checks it against the last one it applied for that order
and records a violation when it is not the next, so a duplicate applied twice or an event
applied out of order shows in the ``violations`` table.

- The shop writes an order and its events (``order.placed``, ``order.topping_added`` for each
  topping, ``order.submitted``) in one transaction, through its outbox ``shop_outbox``.
- Billing adds up the order from its events and, on ``order.submitted``, charges it and emits
  ``payment.completed`` through its outbox ``billing_outbox`` (``ctx.publish``).
- Inventory reserves one unit of stock per pizza base and topping, and records one
  reservation per order on ``order.submitted``.
- The shop marks the order paid on ``payment.completed``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from ..context import HandlerContext
from ..outbox import NewEvent, Outbox, OutboxTable
from ..registry import HandlerRegistry, handler
from ..types import DbConnection

PIZZAS = {"margherita": 8, "marinara": 7, "diavola": 10, "quattro formaggi": 11}
TOPPINGS = {"basil": 1, "olives": 2, "mushrooms": 2, "anchovies": 3, "nduja": 3}
ROLES = ("billing", "inventory", "shop")  # the consumers; relays are "relay-shop" and so on


def schema_name(run: str) -> str:
    return f"pizza_{run}"


def orders_topic(run: str) -> str:
    return f"pizza-orders-{run}"


def payments_topic(run: str) -> str:
    return f"pizza-payments-{run}"


class OrderPlaced(BaseModel):
    """An order was placed, with its pizza; the first event of an order (seq 1)."""

    order_id: str
    seq: int
    pizza: str
    price: int


class ToppingAdded(BaseModel):
    """A topping was added to an order (seq 2, 3, ...)."""

    order_id: str
    seq: int
    topping: str
    price: int


class OrderSubmitted(BaseModel):
    """The order is complete: its total, in euros, is to be charged (the last seq)."""

    order_id: str
    seq: int
    total: int


class PaymentCompleted(BaseModel):
    """Billing charged the order's total."""

    order_id: str
    seq: int
    amount: int


def ddl(schema: str) -> list[str]:
    """The shop's, billing's and inventory's tables (consumerkit creates its own)."""
    s = schema
    return [
        f"CREATE SCHEMA IF NOT EXISTS {s}",
        f"""CREATE TABLE {s}.orders (id text PRIMARY KEY, pizza text NOT NULL,
            total int NOT NULL, items int NOT NULL, events int NOT NULL,
            paid_count int NOT NULL DEFAULT 0, paid_amount int)""",
        f"CREATE TABLE {s}.injected (event_id uuid PRIMARY KEY)",
        f"""CREATE TABLE {s}.progress (consumer text, order_id text, last_seq int NOT NULL,
            total int NOT NULL DEFAULT 0, items int NOT NULL DEFAULT 0,
            PRIMARY KEY (consumer, order_id))""",
        f"""CREATE TABLE {s}.violations (id bigserial PRIMARY KEY, consumer text NOT NULL,
            order_id text NOT NULL, event_type text NOT NULL, expected int, got int)""",
        f"CREATE TABLE {s}.charges (order_id text NOT NULL, amount int NOT NULL)",
        f"CREATE TABLE {s}.stock (item text PRIMARY KEY, reserved int NOT NULL DEFAULT 0)",
        f"CREATE TABLE {s}.reservations (order_id text NOT NULL, items int NOT NULL)",
        f"""CREATE TABLE {s}.workers (role text, pid int, delivered bigint, applied bigint,
            duplicates bigint, dead_lettered bigint, published bigint, stopped bool,
            PRIMARY KEY (role, pid))""",
        f"INSERT INTO {s}.stock (item) SELECT unnest($1::text[])",
    ]


def stock_items() -> list[str]:
    return ["dough", *TOPPINGS]


@dataclass(frozen=True, slots=True)
class Order:
    order_id: str
    pizza: str
    toppings: tuple[str, ...]

    @property
    def total(self) -> int:
        return PIZZAS[self.pizza] + sum(TOPPINGS[t] for t in self.toppings)

    def events(self) -> list[NewEvent]:
        """The order's events in order, each with its ``seq``."""
        oid = self.order_id
        payloads: list[tuple[str, BaseModel]] = [
            ("order.placed", OrderPlaced(order_id=oid, seq=1, pizza=self.pizza,
                                         price=PIZZAS[self.pizza]))]
        for n, topping in enumerate(self.toppings, start=2):
            payloads.append(("order.topping_added", ToppingAdded(
                order_id=oid, seq=n, topping=topping, price=TOPPINGS[topping])))
        payloads.append(("order.submitted", OrderSubmitted(
            order_id=oid, seq=len(payloads) + 1, total=self.total)))
        return [NewEvent(kind, "order", oid, payload) for kind, payload in payloads]


def random_order(rng: random.Random, number: int) -> Order:
    toppings = tuple(rng.sample(sorted(TOPPINGS), rng.randint(0, 2)))
    return Order(f"order-{number:06d}", rng.choice(sorted(PIZZAS)), toppings)


def shop_outbox(schema: str) -> Outbox:
    return Outbox(schema=schema, table="shop_outbox")


def billing_outbox(schema: str) -> Outbox:
    return Outbox(schema=schema, table="billing_outbox")


def outbox_tables(schema: str) -> list[OutboxTable]:
    return [shop_outbox(schema).table, billing_outbox(schema).table]


async def place_order(conn: DbConnection, outbox: Outbox, schema: str,
                      order: Order) -> list[tuple[Any, NewEvent]]:
    """The orders service: the order row and its events commit together, or neither does."""
    events = order.events()
    async with conn.transaction():
        await conn.execute(
            f"INSERT INTO {schema}.orders (id, pizza, total, items, events) "
            "VALUES ($1, $2, $3, $4, $5)",
            order.order_id, order.pizza, order.total, 1 + len(order.toppings), len(events))
        ids = await outbox.add_many(conn, events)
    return list(zip(ids, events, strict=True))


# -- the handlers ------------------------------------------------------------------------------

async def _advance(ctx: HandlerContext, schema: str, consumer: str, order_id: str, seq: int, *,
                   add_total: int = 0, add_items: int = 0) -> tuple[int, int]:
    """Record ``seq`` as the order's last applied event for ``consumer``; a ``seq`` that is not
    the next one is a violation. Returns the order's running total and item count."""
    last = await ctx.tx.fetchval(
        f"SELECT last_seq FROM {schema}.progress WHERE consumer = $1 AND order_id = $2",
        consumer, order_id)
    expected = (last or 0) + 1
    if seq != expected:
        await ctx.tx.execute(
            f"INSERT INTO {schema}.violations (consumer, order_id, event_type, expected, got) "
            "VALUES ($1, $2, $3, $4, $5)", consumer, order_id, ctx.envelope.event_type,
            expected, seq)
    row = await ctx.tx.fetchrow(
        f"""INSERT INTO {schema}.progress AS p (consumer, order_id, last_seq, total, items)
            VALUES ($1, $2, $3, $4, $5)
            ON CONFLICT (consumer, order_id) DO UPDATE SET last_seq = EXCLUDED.last_seq,
                total = p.total + EXCLUDED.total, items = p.items + EXCLUDED.items
            RETURNING total, items""", consumer, order_id, seq, add_total, add_items)
    assert row is not None
    return int(row["total"]), int(row["items"])


def billing_handlers(schema: str) -> HandlerRegistry:
    """Billing: add the order up, charge it once submitted, emit ``payment.completed``."""

    @handler("order.placed")
    async def placed(event: OrderPlaced, ctx: HandlerContext) -> None:
        await _advance(ctx, schema, "billing", event.order_id, event.seq, add_total=event.price)

    @handler("order.topping_added")
    async def topping(event: ToppingAdded, ctx: HandlerContext) -> None:
        await _advance(ctx, schema, "billing", event.order_id, event.seq, add_total=event.price)

    @handler("order.submitted")
    async def submitted(event: OrderSubmitted, ctx: HandlerContext) -> None:
        total, _ = await _advance(ctx, schema, "billing", event.order_id, event.seq)
        await ctx.tx.execute(f"INSERT INTO {schema}.charges (order_id, amount) VALUES ($1, $2)",
                             event.order_id, total)
        await ctx.publish(
            event_type="payment.completed", aggregate_type="payment",
            aggregate_id=event.order_id,
            payload=PaymentCompleted(order_id=event.order_id, seq=1, amount=total))

    return HandlerRegistry([placed, topping, submitted])


def inventory_handlers(schema: str) -> HandlerRegistry:
    """Inventory: a unit of stock per base and topping, one reservation per order."""

    async def take(ctx: HandlerContext, item: str) -> None:
        await ctx.tx.execute(
            f"UPDATE {schema}.stock SET reserved = reserved + 1 WHERE item = $1", item)

    @handler("order.placed")
    async def placed(event: OrderPlaced, ctx: HandlerContext) -> None:
        await _advance(ctx, schema, "inventory", event.order_id, event.seq, add_items=1)
        await take(ctx, "dough")

    @handler("order.topping_added")
    async def topping(event: ToppingAdded, ctx: HandlerContext) -> None:
        await _advance(ctx, schema, "inventory", event.order_id, event.seq, add_items=1)
        await take(ctx, event.topping)

    @handler("order.submitted")
    async def submitted(event: OrderSubmitted, ctx: HandlerContext) -> None:
        _, items = await _advance(ctx, schema, "inventory", event.order_id, event.seq)
        await ctx.tx.execute(
            f"INSERT INTO {schema}.reservations (order_id, items) VALUES ($1, $2)",
            event.order_id, items)

    return HandlerRegistry([placed, topping, submitted])


def shop_handlers(schema: str) -> HandlerRegistry:
    """The shop: mark the order paid."""

    @handler("payment.completed")
    async def paid(event: PaymentCompleted, ctx: HandlerContext) -> None:
        await _advance(ctx, schema, "shop", f"payment:{event.order_id}", event.seq)
        await ctx.tx.execute(
            f"UPDATE {schema}.orders SET paid_count = paid_count + 1, paid_amount = $2 "
            "WHERE id = $1", event.order_id, event.amount)

    return HandlerRegistry([paid])
