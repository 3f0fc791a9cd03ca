"""The torture's mutant ``claim_no_wait`` (:mod:`consumerkit.shared.faults`): claims through
``{table}_claim_no_wait``, the claim function without its wait on the guard
(:mod:`.guard`). Two concurrent copies of an id then both find no committed row, and both are
claimed: the torture must catch the duplicate effect.

The first claim in a process that finds the function missing creates it, in the claim's own
transaction, under an advisory lock: the consumers of a run do not replace it under each
other, and a transaction that rolls back takes its creation with it (the next claim tries
again)."""

from __future__ import annotations

from ..types import DbConnection
from .policy import DedupPolicy
from .rows import claim_function, claim_many_ddl

_MISSING = "SELECT to_regproc($1) IS NULL"


async def without_wait(tx: DbConnection, schema: str, policy: DedupPolicy, sql: str) -> str:
    """``sql`` (a call of ``{table}_claim_many``) calling the function without a wait."""
    name = claim_function(schema, policy.table, "claim_no_wait")
    if await tx.fetchval(_MISSING, name):
        await tx.execute("SELECT pg_advisory_xact_lock(hashtext($1))", name)
        if await tx.fetchval(_MISSING, name):
            await tx.execute(claim_many_ddl(schema, policy, wait="none", suffix="claim_no_wait"))
    return sql.replace(claim_function(schema, policy.table, "claim_many"), name)
