"""The demo that the README's first command runs, on the test services (twice, so a second
run against the same database is not mistaken for duplicates of the first)."""

from __future__ import annotations

import pytest

from consumerkit.demo import run_demo


async def test_demo_charges_every_order_exactly_once(
    postgres_dsn: str, kafka_bootstrap: str, capsys: pytest.CaptureFixture[str],
) -> None:
    for _ in range(2):
        result = await run_demo(120, 0.4, kafka=kafka_bootstrap, postgres=postgres_dsn)
        assert result.exactly_once
        assert result.deliveries > result.orders  # the duplicates really were delivered
    assert "every order charged exactly once" in capsys.readouterr().out
