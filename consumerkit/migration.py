"""Creating and upgrading consumerkit's tables: the one function every caller goes through.

Consumers started with ``migrate=True`` call :func:`migrate`, and so does ``consumerkit
migrate``; the steps themselves live in :mod:`consumerkit.schema` (dead letters, the dedup
table, parking, offsets) and :mod:`consumerkit.outbox.table` (each outbox). A webhook receiver,
which has no outbox and is kept independent of the outbox package, calls the schema's part,
:func:`~consumerkit.schema.migrate_schema`, directly.
"""

from __future__ import annotations

from collections.abc import Sequence

from .dedup.policy import DedupPolicy
from .dedup.postgres import DEFAULT_POLICY
from .errors import ConfigurationError
from .outbox.table import OutboxTable, migrate_outbox
from .schema import migrate_schema
from .types import DbConnection


async def migrate(
    conn: DbConnection, schema: str = "consumerkit",
    dedup: DedupPolicy | None = DEFAULT_POLICY, *, outboxes: Sequence[OutboxTable] = (),
    namespace: str | None = None, older_transactions_timeout: float = 300.0,
) -> None:
    """Create or upgrade consumerkit's tables in ``schema``, then each of ``outboxes``.

    With a ``dedup`` policy: the schema-wide tables (dead letters, the dedup retention
    registry, consumer offsets, parked keys), the policy's dedup table with its claim
    functions, then (partitioned layout) its partitions for the next intervals, or (table
    layout) ``namespace``'s retention recorded. With ``dedup=None``, none of these: only the
    outboxes, for a service that writes an outbox and consumes nothing.

    Each outbox (in its own :attr:`~consumerkit.outbox.OutboxTable.schema`) gets its events
    table and side tables; one kept for a retention also gets the schema's partition functions,
    the publication change data capture reads, and its partitions ahead. The replication slot
    is not made here: :func:`~consumerkit.outbox.prepare_cdc`, or ``consumerkit migrate
    --outbox-cdc``.

    Idempotent: every step is recorded in ``{schema}.consumerkit_schema_version`` and runs
    once. Safe concurrently: each transaction holds an advisory lock of the schema, so
    processes racing to migrate run one after the other. Call it on a connection outside a
    transaction: an upgrade that replaces the claim function commits, then waits up to
    ``older_transactions_timeout`` seconds for the transactions older than that commit.

    Raises :class:`~consumerkit.ConfigurationError` when there is nothing to migrate
    (``dedup=None`` and no outbox) or a name is invalid, and
    :class:`~consumerkit.StartupError` when the database refuses a step, an older transaction
    outlasts the timeout, or a table exists with the other layout (dedup or outbox).
    """
    if dedup is None and not outboxes:
        raise ConfigurationError("migrate: nothing to migrate (dedup=None and no outboxes)")
    if dedup is not None:
        await migrate_schema(conn, schema, dedup, namespace=namespace,
                             older_transactions_timeout=older_transactions_timeout)
    for table in outboxes:
        await migrate_outbox(conn, table)
