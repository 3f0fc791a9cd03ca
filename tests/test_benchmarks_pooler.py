"""Smoke test of the pooler benchmark (``python -m benchmarks.pooler``) at a tiny size: the
consumer's batch path and the relay, direct and through real PgBouncers in session and
transaction mode, in one run. It checks that the harness runs, checks effects and counts,
not how fast anything is."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import pgbouncer, pooler
from benchmarks.context import Services


async def test_the_pooler_cells_run_through_both_pgbouncer_modes(
    postgres_dsn: str, kafka_bootstrap: str, tmp_path: Path,
) -> None:
    if (reason := pgbouncer.missing()) is not None:
        pytest.skip(reason)
    svc = Services(postgres_dsn, kafka_bootstrap, "test services", "test broker", None, "none")
    doc = await pooler.run(svc, events=200, rows=100, runs=1, log=lambda _line: None)
    tracked = pgbouncer.tracks_prepared_statements()  # 1.21+: two ways more
    for cell in ("consumer", "relay"):
        rows = {r["way"]: r for r in doc[cell]}
        more = ([f"transaction, {pooler.PREPARED}"] if tracked else []) + (
            [f"transaction, {pooler.PREPARED}, postgres_pooler='none'"]
            if tracked and cell == "consumer" else [])
        assert list(rows) == ["direct", "session", "transaction", *more], cell
        assert all(r["exact"] and r["median"] > 0 for r in rows.values()), rows
        assert rows["direct"]["ratio"] == 1.0
        assert rows["direct"]["statements_per_event"] is None  # no PgBouncer to count
        for way in pooler.MODES:  # PgBouncer counted the work that went through it
            assert (rows[way]["ratio"] or 0) > 0, rows[way]
            assert rows[way]["statements_per_event"] > 0, rows[way]
            assert rows[way]["statements_per_transaction"] >= 1, rows[way]
        for name in more:  # one PgBouncer for both ways: its counts are no one way's
            assert (rows[name]["ratio"] or 0) > 0, rows[name]
    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks\n")
    text = pooler.render(doc)
    pooler.write_docs(text, page, tmp_path / "pooler.md")
    pooler.write_docs(text, page, tmp_path / "pooler.md")  # a second run replaces the first
    assert page.read_text().count(pooler.BEGIN) == 1
    assert "| transaction |" in page.read_text()
