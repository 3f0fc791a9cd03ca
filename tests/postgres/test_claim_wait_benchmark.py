"""``python -m benchmarks.claim_wait`` at a tiny size: both bodies measured, the guard's size
read, the schema dropped afterwards."""

from __future__ import annotations

import pytest

from benchmarks.claim_wait import SCHEMA, run

from .conftest import Conn


async def test_the_claim_wait_benchmark_measures_both_bodies(
    server_dsn: str, conn: Conn, capsys: pytest.CaptureFixture[str],
) -> None:
    await run(server_dsn, workers=2, batch=20, rounds=1, seconds=0.3, sustain=0.4, every=0.2)
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines()
            if line.startswith(("| advisory", "| guard"))}
    assert set(rows) == {"advisory", "guard"}
    assert "guard / advisory per round:" in out
    assert "| guard heap | guard index |" in out
    assert await conn.fetchval("SELECT to_regnamespace($1)", SCHEMA) is None
