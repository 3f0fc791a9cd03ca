"""The wheel holds the product: the test kit a team's tests use, not the project's own harnesses
(Apache Kafka from Maven's jars, Debezium, logical and replicated PostgreSQL), which live in
tests/harness."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# What a module of the harness would be called, wherever in the package it landed.
HARNESS_WORDS = ("maven", "_jars", "debezium", "replication", "pg_logical", "kafka_security",
                 "tcp_proxy", "describe_quorum", "describe_producers")
# The test kit the wheel keeps (docs/testing.md, "What the wheel ships for your tests").
KIT = ("consumerkit/testing/__init__.py", "consumerkit/testing/harness.py",
       "consumerkit/testing/plugin.py", "consumerkit/testing/services.py")


def build_wheel(out: Path) -> Path:
    """The wheel hatchling builds from the repository, as ``pip wheel .`` would (offline: the
    backend is the one installed with the dev extra)."""
    done = subprocess.run(
        [sys.executable, "-c",
         "import sys; from hatchling.build import build_wheel; print(build_wheel(sys.argv[1]))",
         str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return out / done.stdout.strip().splitlines()[-1]


def harness_modules(names: list[str]) -> list[str]:
    return sorted(n for n in names
                  if n.endswith(".py") and any(w in Path(n).stem for w in HARNESS_WORDS)
                  # the outbox's own Debezium settings and replication checks are product
                  and not n.startswith("consumerkit/outbox/"))


def test_the_wheel_holds_the_test_kit_and_no_harness(tmp_path: Path) -> None:
    with zipfile.ZipFile(build_wheel(tmp_path)) as wheel:
        names = wheel.namelist()
    assert set(KIT) <= set(names)
    assert harness_modules(names) == []
    stray = ("tests/", "consumerkit/testing/kafka", "consumerkit/testing/_describe")
    assert not [n for n in names if n.startswith(stray)]


def test_the_check_finds_a_harness_module() -> None:
    names = ["consumerkit/testing/kafka_jars.py", "consumerkit/testing/debezium.py",
             "consumerkit/testing/replication.py", "consumerkit/outbox/debezium.py",
             "consumerkit/testing/harness.py"]
    assert harness_modules(names) == ["consumerkit/testing/debezium.py",
                                      "consumerkit/testing/kafka_jars.py",
                                      "consumerkit/testing/replication.py"]
