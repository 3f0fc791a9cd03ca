"""Set-based handlers and pipelined writes: a batch handler applies all the events of its type
in a batch with one statement (``@handler(..., batch=True)``), and a per-event handler queues
writes whose result it does not need with ``ctx.defer``, sent together before the commit."""

from __future__ import annotations

from pydantic import BaseModel

from consumerkit import BatchContext, HandlerContext, HandlerRegistry, handler


class StockCounted(BaseModel):
    sku: str
    quantity: int


@handler("stock.counted", batch=True)
async def record_counts(events: list[StockCounted], ctx: BatchContext) -> None:
    # every fresh stock.counted event of the batch, in per-key order, so the last count of a
    # sku is its latest; one statement for all (ON CONFLICT takes one row per sku)
    latest = {e.sku: e.quantity for e in events}
    await ctx.tx.execute(
        "INSERT INTO stock (sku, quantity) SELECT * FROM unnest($1::text[], $2::int[]) "
        "ON CONFLICT (sku) DO UPDATE SET quantity = excluded.quantity",
        list(latest), list(latest.values()))
    ctx.log.info("recorded %d counts", len(events))


class OrderShipped(BaseModel):
    order_id: str
    items: int


@handler("order.shipped", batch=True)
async def announce_shipments(events: list[OrderShipped], ctx: BatchContext) -> None:
    for event, envelope in zip(events, ctx.envelopes, strict=True):
        # caused_by: the event this one follows from (its causation_id and correlation_id)
        await ctx.publish(
            caused_by=envelope, event_type="shipment.announced", aggregate_type="order",
            aggregate_id=event.order_id, payload={"order_id": event.order_id})


class LineAdded(BaseModel):
    order_id: str
    sku: str
    quantity: int


@handler("line.added")
async def add_line(event: LineAdded, ctx: HandlerContext) -> None:
    # queued, not awaited: sent with the other queued writes of the transaction; one query
    # per event (both writes in one statement), so a batch's run of them is one pipelined
    # executemany
    ctx.defer("WITH line AS (INSERT INTO order_lines (order_id, sku, quantity) "
              "VALUES ($1, $2, $3)) UPDATE orders SET lines = lines + 1 WHERE order_id = $1",
              event.order_id, event.sku, event.quantity)


class LineRemoved(BaseModel):
    order_id: str
    sku: str


@handler("line.removed")
async def remove_line(event: LineRemoved, ctx: HandlerContext) -> None:
    ctx.defer("DELETE FROM order_lines WHERE order_id = $1 AND sku = $2",
              event.order_id, event.sku)
    # a read through ctx.tx sends the queued writes first: the handler sees its own writes
    left = await ctx.tx.fetchval(
        "SELECT count(*) FROM order_lines WHERE order_id = $1", event.order_id)
    ctx.defer("UPDATE orders SET lines = $2 WHERE order_id = $1", event.order_id, left)


handlers = HandlerRegistry([record_counts, announce_shipments, add_line, remove_line])
