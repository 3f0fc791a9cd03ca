"""The benchmark run's broker choice (``python -m benchmarks --broker tansu|kafka``) without a
broker: what each kind means for topics and producers, and the docs page keeping each broker's
run in its own section. The run on three Kafka brokers is tests/test_benchmarks_kafka.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks import broker, docs, suite


def test_a_kafka_cluster_gets_three_replicas_and_idempotent_producers() -> None:
    address = "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"
    assert broker.traits(address) == broker.TANSU  # never declared: one replica, no idempotence
    with broker.declare(address, "kafka", brokers=3) as traits:
        assert traits == broker.Traits("kafka", replication_factor=3, idempotence=True)
        assert broker.traits(address) is traits
        assert broker.producer_flags(address) == ["--idempotence"]
    assert broker.traits(address) == broker.TANSU
    assert broker.producer_flags(address) == []
    with broker.declare("127.0.0.1:9", "kafka", brokers=1) as one:  # a single-node Kafka
        assert (one.replication_factor, one.idempotence) == (1, True)
    with broker.declare("127.0.0.1:9", "kafka", brokers=5) as five:
        assert five.replication_factor == 3
    with broker.declare("127.0.0.1:9", "tansu") as tansu:
        assert tansu == broker.TANSU
    with pytest.raises(ValueError, match="broker kind must be one of tansu, kafka"):
        broker.declare("127.0.0.1:9", "redpanda").__enter__()


def test_the_command_takes_the_broker() -> None:
    assert suite.parse([]).broker == "tansu"
    assert suite.parse(["--broker", "kafka", "--cells", "main,relay"]).broker == "kafka"
    with pytest.raises(SystemExit):
        suite.parse(["--broker", "redpanda"])


def _document(kind: str, started: str) -> dict[str, Any]:
    return {"broker": kind, "started": started, "profile": "quick", "seconds": 1.0,
            "acceptance": [], "cells": [], "context": {"cpus": "2"}}


def test_each_broker_s_run_replaces_only_its_own_section(tmp_path: Path) -> None:
    page = tmp_path / "benchmarks.md"
    docs.write(_document("tansu", "2026-01-01 00:00 UTC"), page)
    first = page.read_text()
    assert "## Run 2026-01-01 00:00 UTC (quick profile, 1 s)" in docs._run_of(first, "tansu")
    assert docs._run_of(first, "kafka") == docs.NOT_YET
    assert "--broker kafka --profile full --cells main,relay --docs" in first

    docs.write(_document("kafka", "2026-01-02 00:00 UTC"), page)
    second = page.read_text()
    assert docs._run_of(second, "tansu") == docs._run_of(first, "tansu")
    assert docs._run_of(second, "kafka").startswith(
        "## Run 2026-01-02 00:00 UTC on Apache Kafka (quick profile, 1 s)")

    docs.write(_document("tansu", "2026-01-03 00:00 UTC"), page)
    third = page.read_text()
    assert "2026-01-03" in docs._run_of(third, "tansu")
    assert docs._run_of(third, "kafka") == docs._run_of(second, "kafka")
    # the peers compared from their code, then the relay against Debezium (benchmarks/cdc.md)
    assert third.endswith(docs.COMPARED.read_text() + "\n" + docs.CDC.read_text())
