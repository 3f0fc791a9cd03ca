"""Smoke test of the benchmark suite on Apache Kafka (``python -m benchmarks --broker kafka``):
the main and relay cells at a tiny size on a three-broker cluster, every peer on it in one run.
It checks that the Kafka path works (topics of three replicas, idempotent producers, the
correctness gate), not how fast anything is. Skips without Java or Maven, saying what to
install."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from benchmarks import broker, docs, markdown, suite
from benchmarks.context import services
from benchmarks.outbox_peers import PEERS as RELAY_PEERS
from benchmarks.outbox_peers import RelaySpec
from benchmarks.profiles import MAIN, Cell, Profile
from benchmarks.runner import Settings
from benchmarks.workload import create_topic, delete_topic
from consumerkit.transport.kafka_access import describe_topics
from tests.harness.kafka import KafkaCluster

from .test_benchmarks import NoDedupPeer

ROOT = Path(__file__).resolve().parent.parent
KAFKA_SMOKE = Profile("smoke", (
    Cell(MAIN, "smoke on Kafka: 200 messages over 10 keys, 10 % duplicates",
         Settings(events=200, keys=10, dup_rate=0.1, runs=1, deadline=120),
         peers=("raw", "textbook", "set-based", "consumerkit")),
), relay=RelaySpec(rows=200, runs=1, deadline=120))


async def _replicas(bootstrap: str, topic: str, partitions: int = 4) -> set[int]:
    """The replica counts of ``topic``'s partitions, once a broker lists all of them: the
    broker asked may learn of a new topic after the one ``create_topic`` asked."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        async with asyncio.timeout(30):
            while True:
                (described,) = await describe_topics(admin, [topic])
                if described["error_code"] == 0 and len(described["partitions"]) == partitions:
                    return {len(p["replicas"]) for p in described["partitions"]}
                await asyncio.sleep(0.1)
    finally:
        await admin.close()


@pytest.mark.slow
async def test_main_and_relay_cells_run_on_three_kafka_brokers(
    postgres_dsn: str, kafka_cluster: KafkaCluster, tmp_path: Path,
) -> None:
    bootstrap = kafka_cluster.bootstrap
    with services(postgres_dsn, bootstrap, broker_kind="kafka") as svc:
        assert svc.kind == "kafka"
        assert broker.traits(bootstrap) == broker.Traits("kafka", 3, True)
        assert broker.producer_flags(bootstrap) == ["--idempotence"]
        topic = await create_topic(bootstrap)
        try:
            assert await _replicas(bootstrap, topic) == {3}
        finally:
            await delete_topic(bootstrap, topic)
        document = await suite.run_suite(svc, KAFKA_SMOKE, lambda _line: None,
                                         extra=(NoDedupPeer,))
    # the run's traits end with it: an undeclared broker is taken for Tansu
    assert broker.traits(bootstrap) == broker.TANSU

    assert document["broker"] == "kafka"
    assert "idempotent producers with acks=all" in document["context"]["broker"]
    (cell,) = document["cells"]
    peers: dict[str, dict[str, Any]] = {p["peer"]: p for p in cell["peers"]}
    assert list(peers) == ["raw", "textbook", "set-based", "consumerkit", NoDedupPeer.name]
    for name in ("raw", "textbook", "set-based", "consumerkit"):
        assert peers[name]["exact"], f"{name}: {peers[name]['samples']}"
        assert peers[name]["median_msg_per_s"] > 0
    assert not peers[NoDedupPeer.name]["exact"]  # the gate fails on Kafka too
    assert "20 duplicate effects" in peers[NoDedupPeer.name]["samples"][0]["detail"]
    relay = {p["peer"]: p for p in document["relay"]["peers"]}
    assert list(relay) == list(RELAY_PEERS)
    assert relay["consumerkit"]["exact"], relay["consumerkit"]["samples"]
    for name, peer in relay.items():
        if not peer["unavailable"]:
            assert peer["exact"], f"relay {name}: {peer['samples']}"

    text = markdown.render(document)
    assert text.startswith("## Run ")
    assert " on Apache Kafka (smoke profile, " in text
    # --docs writes the Kafka section and keeps the Tansu run as it was
    page = tmp_path / "benchmarks.md"
    shutil.copy(docs.PAGE, page)
    tansu_run = docs._run_of(page.read_text(), "tansu")
    assert tansu_run.startswith("## Run ")
    docs.write(document, page)
    written = page.read_text()
    assert docs._run_of(written, "tansu") == tansu_run
    assert docs._run_of(written, "kafka") == text.strip("\n")
    assert docs.NOT_YET not in written


def test_without_java_the_kafka_run_says_what_to_install(tmp_path: Path) -> None:
    bare = tmp_path / "bin"  # nothing on PATH: no java, no mvn
    bare.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--broker", "kafka", "--cells", "main",
         "--out", str(tmp_path / "results")],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
        env={**os.environ, "PATH": str(bare)})
    assert done.returncode == 2, done.stderr
    assert done.stderr == ("python -m benchmarks: Apache Kafka needs Java 17 or newer: install "
                           "a JDK (e.g. apt-get install openjdk-17-jdk-headless)\n")
    assert not (tmp_path / "results").exists()
