"""Dead letters as the consumer stores them, written straight into the table (thousands in
a second, where pushing them through a broker and a failing handler would take minutes)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest

from consumerkit import migrate
from consumerkit.deadletter.table import TABLE, encode_headers
from consumerkit.shared.identifiers import qualified

from ..integration.ledger import Event, Step, create_ledger

HERE = Path(__file__).parent
APP = "dead-app"


@dataclass(frozen=True, slots=True)
class Letter:
    """A dead letter of the ledger's events: where it was and what it carried."""

    event: Event
    partition: int
    offset: int
    value: bytes | None = None  # None: the event's own payload


def letters(keys: int, per_key: int, partitions: int = 4) -> list[Letter]:
    """Dead letters of ``keys`` keys, ``per_key`` each; a key stays on its partition and its
    events take increasing offsets, interleaved with the other keys' as on a topic."""
    offsets = [0] * partitions
    found = []
    for seq in range(1, per_key + 1):
        for k in range(keys):
            part = k % partitions
            found.append(Letter(Event(f"evt-{k}-{seq}", f"key-{k}", seq), part, offsets[part]))
            offsets[part] += 1
    return found


async def bury(pool: asyncpg.Pool, schema: str, buried: list[Letter],
               consumer: str = APP) -> None:
    """Migrate ``schema``, create the ledger and store ``buried`` as dead letters."""
    async with pool.acquire() as conn:
        await migrate(conn, schema)
        await create_ledger(conn, schema)
        await conn.executemany(
            f'INSERT INTO {qualified(schema, TABLE)} (consumer, topic, "partition", "offset", '
            "key, value, headers, reason, detail, attempts, event_id, event_type, failed_at) "
            "VALUES ($1, 'steps', $2, $3, $4, $5, $6::jsonb, 'handler_failed', 'boom', 3, $7, "
            "'step.recorded', $8)",
            [(consumer, b.partition, b.offset, b.event.key.encode(),
              b.value if b.value is not None
              else Step(key=b.event.key, seq=b.event.seq).model_dump_json().encode(),
              encode_headers(b.event.wire_headers()), b.event.event_id, datetime.now(UTC))
             for b in buried])


async def statuses(pool: asyncpg.Pool, schema: str) -> dict[str, int]:
    rows = await pool.fetch(
        f"SELECT status, count(*) AS n FROM {qualified(schema, TABLE)} GROUP BY status")
    return {r["status"]: r["n"] for r in rows}


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    shutil.copy(HERE / "app_dead_letters.py", tmp_path / "app_dead_letters.py")
    return tmp_path
