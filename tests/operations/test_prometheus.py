"""A real Prometheus server loads docs/operations/alerts.yml, scrapes a running consumer's
metrics port and fires ConsumerKitDeadLetter when a record cannot be decoded, scrapes a relay
and fires ConsumerKitOutboxFailed when it gives up on a row; every PromQL snippet of the
operations pages is a query it accepts.

Needs Debian's ``prometheus`` package; without it these tests skip with the reason.
"""

from __future__ import annotations

import re
import time
from datetime import datetime
from pathlib import Path

import asyncpg

from consumerkit import Metrics, Postgres, migrate
from consumerkit.outbox import KafkaSink, Outbox, OutboxTable, Relay
from consumerkit.testing.services import free_port

from ..brokers import PRODUCER_OPTIONS
from ..integration.conftest import LedgerTopic
from ..integration.ledger import Running, build, publish_raw, settled, wait_for
from ..outbox.conftest import RelayRunning
from .conftest import OPERATIONS, prometheus
from .prometheus import PrometheusApi, documented_config, running_prometheus

ALERT = "ConsumerKitDeadLetter"
SCRAPE_TIMEOUT = 60.0
FIRE_TIMEOUT = 60.0


async def test_a_poison_message_fires_the_dead_letter_alert(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    tmp_path: Path,
) -> None:
    binary = prometheus()
    topic = await ledger_topic(partitions=1)
    port = free_port()
    consumer = build("alerts", pg_schema, topic, postgres_dsn, kafka_bootstrap,
                     metrics=Metrics(port=port, host="127.0.0.1"))
    async with (Running(consumer),
                running_prometheus(binary, tmp_path, [f"127.0.0.1:{port}"]) as api):
        # the consumer is scraped and ready, and the rules have run since: nothing fires
        ready = f'consumerkit_ready{{role="consumer",name="{consumer.name}"}} == 1'
        await wait_for(lambda: _has(api, ready), SCRAPE_TIMEOUT, "a scrape of the consumer")
        scraped = time.time()
        await wait_for(lambda: _evaluated_since(api, scraped), SCRAPE_TIMEOUT,
                       "an evaluation of the rules after the scrape")
        assert await api.alerts(ALERT) == []

        await publish_raw(kafka_bootstrap, topic, [
            (b"key-1", b"{not json", [("id", b"poison-1"), ("event_type", b"step.recorded")])])
        await wait_for(lambda: settled(consumer, 1), 60, "the poison record settled")
        assert consumer.stats.dead_lettered == 1
        await wait_for(lambda: _firing(api, ALERT), FIRE_TIMEOUT, f"{ALERT} to fire")

        [alert] = await api.alerts(ALERT)
        assert alert["labels"] == {"alertname": ALERT, "severity": "warning",
                                   "consumer": consumer.name, "topic": topic}
        assert alert["annotations"]["runbook_url"] == "runbooks.md#a-dead-letter"
        assert float(alert["value"]) >= 1


async def test_a_row_given_up_on_fires_the_outbox_alert(
    pg_pool: asyncpg.Pool[asyncpg.Record], postgres_dsn: str, kafka_bootstrap: str,
    pg_schema: str, tmp_path: Path,
) -> None:
    binary = prometheus()
    async with pg_pool.acquire() as conn:
        await migrate(conn, dedup=None, outboxes=[OutboxTable(pg_schema, "outbox")])
    port = free_port()
    sink = KafkaSink(kafka_bootstrap, route="{aggregate_type}",
                     kafka_options=dict(PRODUCER_OPTIONS))
    relay = Relay(Postgres(dsn=postgres_dsn, schema=pg_schema), sink,
                  metrics=Metrics(port=port, host="127.0.0.1", refresh_interval=0.2),
                  table="outbox", handle_signals=False)
    label = f"{pg_schema}.outbox"
    async with (RelayRunning(relay),
                running_prometheus(binary, tmp_path, [f"127.0.0.1:{port}"]) as api):
        scraped = f'consumerkit_outbox_failed{{outbox="{label}"}} == 0'
        await wait_for(lambda: _has(api, scraped), SCRAPE_TIMEOUT, "a scrape of the relay")
        since = time.time()
        await wait_for(lambda: _evaluated_since(api, since, "consumerkit-outbox"),
                       SCRAPE_TIMEOUT, "an evaluation of the rules after the scrape")
        assert await api.alerts("ConsumerKitOutboxFailed") == []

        async with pg_pool.acquire() as conn, conn.transaction():
            # routed to an invalid topic name: refused for good, given up on at once
            await Outbox(pg_schema, "outbox").add(
                conn, event_type="order.placed", aggregate_type="no such topic",
                aggregate_id="o-1", payload={})
        await wait_for(lambda: _firing(api, "ConsumerKitOutboxFailed"), FIRE_TIMEOUT,
                       "ConsumerKitOutboxFailed to fire")

        [alert] = await api.alerts("ConsumerKitOutboxFailed")
        assert alert["labels"] == {"alertname": "ConsumerKitOutboxFailed",
                                   "severity": "warning", "outbox": label}
        assert alert["annotations"]["summary"] == f"Rows given up on in outbox {label}: 1"


async def test_every_promql_snippet_of_the_operations_pages_is_a_valid_query(
    tmp_path: Path,
) -> None:
    binary = prometheus()
    snippets = [block for page in sorted(OPERATIONS.glob("*.md"))
                for block in re.findall(r"^ *```promql\n(.*?)^ *```", page.read_text(),
                                        re.MULTILINE | re.DOTALL)]
    assert len(snippets) >= 10
    async with running_prometheus(binary, tmp_path, ["127.0.0.1:1"]) as api:
        for snippet in snippets:
            await api.query(snippet)  # a parse error answers status "error"


def test_the_documented_configuration_scrapes_one_job() -> None:
    config = documented_config()
    [job] = config["scrape_configs"]
    assert job["job_name"] == "consumerkit"
    assert config["rule_files"] == ["consumerkit-alerts.yml"]


async def _has(api: PrometheusApi, expr: str) -> bool:
    return bool(await api.query(expr))


async def _evaluated_since(api: PrometheusApi, since: float,
                           group: str = "consumerkit-consumer") -> bool:
    last = await api.evaluations(group)
    return last is not None and datetime.fromisoformat(last).timestamp() > since


async def _firing(api: PrometheusApi, name: str) -> bool:
    return any(a["state"] == "firing" for a in await api.alerts(name))
