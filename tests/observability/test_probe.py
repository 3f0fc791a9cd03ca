"""The readiness probe's PostgreSQL check: an answer within the timeout, the reason when
none comes, and a new connection after the old one was lost."""

from __future__ import annotations

import asyncpg

from consumerkit.shared.observing import Probe
from consumerkit.testing.services import free_port


async def test_probe_answers_reconnects_and_says_why_not(
    postgres_dsn: str, pg_pool: asyncpg.Pool[asyncpg.Record],
) -> None:
    probe = Probe(postgres_dsn, "probe-test")
    try:
        assert await probe.check() is None
        killed = await pg_pool.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = 'consumerkit-probe probe-test'")
        assert killed == 1
        first = await probe.check()  # the lost connection fails once, then is replaced
        assert first is None or first.startswith("PostgreSQL does not answer")
        assert await probe.check() is None
    finally:
        await probe.close()

    nowhere = Probe(f"postgresql://postgres@127.0.0.1:{free_port()}/none", "nowhere")
    reason = await nowhere.check()
    assert reason is not None
    assert reason.startswith("PostgreSQL does not answer: ")
    await nowhere.close()
