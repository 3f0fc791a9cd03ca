"""``python -m benchmarks.outbox_retention`` at a tiny size: both ways remove the same expired
rows, today's stay, and the loaded pass times the writer around each operation."""

from __future__ import annotations

from benchmarks import outbox_retention


async def test_drop_and_delete_remove_the_same_rows(postgres_dsn: str) -> None:
    results = await outbox_retention.run(postgres_dsn, 300, log=lambda _line: None)
    assert [(r.method, r.mode) for r in results] == [
        ("drop", "quiet"), ("delete", "quiet"), ("drop", "loaded"), ("delete", "loaded")]
    assert all(r.removed == 300 for r in results)
    assert all(r.vacuum_seconds is not None for r in results if r.method == "delete")
    assert all(r.before and r.during for r in results if r.mode == "loaded")
    text = outbox_retention.table_md(results, 300)
    assert text.count("\n| drop |") == 2
    assert text.count("\n| delete |") == 2
