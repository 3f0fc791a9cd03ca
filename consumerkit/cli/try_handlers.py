"""``consumerkit check --handlers MODULE:ATTR --try-handlers``: would the handlers' statements
meet the tables, columns, schemas and privileges they need?

Each handler runs once, on the first waiting record of its type that decodes (a parked record,
a dead letter, an outbox row) or else on an instance built from its model
(:mod:`.sample_event`), with a ``ctx.tx`` whose statements are prepared and explained, never
run (:mod:`.dry_connection`), inside a read-only transaction that is always rolled back.
``ctx.defer`` goes through it too, as does ``ctx.publish`` (the outbox's insert is checked,
nothing is written). A statement the database refuses for a reason every record would hit
(:data:`consumerkit.engine.systemic.SYSTEMIC`: an undefined table, column or schema, a missing
privilege) is a problem: the consumer would stall on it after the deploy. Anything else the
handler raises is said ("could not be tried") without failing the check: the dry connection
returns no rows, which a handler may not expect.

Opt-in: the handler's own code runs, and it may call other services.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, cast

import asyncpg
from pydantic import BaseModel

from ..consumer import Consumer
from ..context import BatchContext, HandlerContext
from ..engine.decode import Decoded
from ..engine.systemic import systemic_cause
from ..envelope import Envelope
from ..registry import Route
from ..shared.deferred import Deferred
from ..types import DbConnection
from .dry_connection import DryConnection
from .sample_event import Unbuildable, sample

TIMEOUT = 30.0  # seconds a handler may take, at most (less if the consumer's limit is less)
STATEMENT_TIMEOUT = "30s"


class Findings(Protocol):
    def ok(self, text: str) -> None: ...
    def note(self, text: str) -> None: ...
    def problem(self, text: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Trial:
    """What a handler is tried on: where it came from, its envelope and its event."""

    source: str
    envelope: Envelope
    event: BaseModel


def trial(where: str, decoded: Decoded) -> Trial:
    return Trial(where, decoded.envelope, decoded.event)


async def try_handlers(consumer: Consumer, conn: asyncpg.Connection[Any],
                       found: dict[str, Trial], report: Findings) -> None:
    """Run each handler of ``consumer`` once on ``found[route.name]`` (or a built event)."""
    routes = [*consumer.routes.by_type.values(), *consumer.routes.by_topic.values()]
    for route in routes:
        what = f"handler {route.name} ({_key(route)})"
        chosen = found.get(route.name)
        if chosen is None:
            try:
                chosen = Trial("a built instance", _envelope(consumer, route),
                               sample(route.model))
            except Unbuildable as exc:
                report.note(f"{what} could not be tried: no waiting record of its type and "
                            f"no instance of {route.model.__name__} could be built: {exc}")
                continue
        verdict, text = await try_route(consumer, conn, route, chosen)
        getattr(report, verdict)(f"{what}{text}")


async def try_route(consumer: Consumer, conn: asyncpg.Connection[Any], route: Route,
                    chosen: Trial) -> tuple[str, str]:
    """Run ``route``'s handler on ``chosen`` with its statements checked, never run; the
    verdict (``ok``, ``note`` or ``problem``, as :class:`Findings` names them) and what to
    say after the handler's name."""
    dry = DryConnection(conn)
    tx = conn.transaction(readonly=True)
    await tx.start()
    try:
        await conn.execute(f"SET LOCAL statement_timeout = '{STATEMENT_TIMEOUT}'")
        error = await _run(consumer, route, dry, chosen)
    finally:
        await tx.rollback()  # nothing a handler did stays, whatever it was
    on = f"tried on {chosen.source}"
    refused = next((systemic_cause(e) for e in (dry.refused, error)
                    if e is not None and systemic_cause(e) is not None), None)
    if refused is not None:
        return "problem", f", {on}: {refused.sqlstate} {refused}"
    if error is not None:
        return "note", (f" could not be tried on {chosen.source}: "
                        f"{type(error).__name__}: {error}")[:500]
    return "ok", (f", {on}: {dry.checked} statement{'' if dry.checked == 1 else 's'} "
                  "checked, none refused")


async def _run(consumer: Consumer, route: Route, dry: DryConnection,
               chosen: Trial) -> BaseException | None:
    """The handler's error, or None if it returned and its deferred writes were accepted."""
    tx = cast(DbConnection, dry)  # the statements a handler may send, checked instead of run
    deferred = Deferred(tx)
    ctx: HandlerContext | BatchContext
    if route.batch:
        ctx = BatchContext(tx, [chosen.envelope], 1, handler=route.name,
                           outbox=consumer.outbox, deferred=deferred, publishes=route.publishes)
        call = route.func([chosen.event], ctx)
    else:
        ctx = HandlerContext(tx, chosen.envelope, 1, handler=route.name,
                             outbox=consumer.outbox, deferred=deferred,
                             publishes=route.publishes)
        call = route.func(chosen.event, ctx)
    limit = min(TIMEOUT, consumer.handler_timeout or TIMEOUT)
    try:
        await asyncio.wait_for(call, limit)
        await deferred.flush()  # as the consumer sends them before its commit
    except TimeoutError:
        return TimeoutError(f"did not finish within {limit:g} s")
    except Exception as exc:
        return exc
    return None


def _key(route: Route) -> str:
    return route.event_type if route.event_type is not None else f"topic {route.topic}"


def _envelope(consumer: Consumer, route: Route) -> Envelope:
    now = datetime.now(UTC)
    return Envelope(f"check-{route.name}", "header", route.event_type, None,
                    route.topic or consumer.topics[0], 0, 0, now, occurred_at=now)
