"""The deployment files in ``examples/service/`` (docs/deployment.md) against the code they
rely on: the probes' paths are answered by the health server as a probe needs, the ports are
the metrics port the manifest's variables give the settings, the grace period outlasts the
consumer's drain, the image copies files that exist and its entrypoint is a command line the
CLI parses and a consumer it loads. ``tests/docs/test_service.py`` runs the same module under
``consumerkit run`` and probes the same paths on the live consumer."""

from __future__ import annotations

import asyncio
import json
import os
import re
import tomllib
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from consumerkit import Consumer
from consumerkit.cli import _parser
from consumerkit.observability.server import HealthServer
from consumerkit.settings import ConsumerSettings, env_name, settings_fields

from .test_service import SERVICE, container, deployment, load_app, probe_paths

ROOT = Path(__file__).resolve().parents[2]
SECRET_DSN = "postgresql://billing@db.invalid/billing"
# what docs/operations/index.md asks beyond the drain: leaving the group, the last commit
GRACE_MARGIN = 15


def manifest_settings(monkeypatch: pytest.MonkeyPatch) -> ConsumerSettings:
    """The settings ``consumerkit run`` loads from the manifest's variables (a secret's value
    stands in for its reference)."""
    for name in [n for n in os.environ if n.startswith("CONSUMERKIT_")]:
        monkeypatch.delenv(name)
    for var in container()["env"]:
        monkeypatch.setenv(var["name"], var.get("value", SECRET_DSN))
    return ConsumerSettings(_env_file=None)


def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of each instruction, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (SERVICE / "Dockerfile").read_text())
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip())
            for line in text.splitlines() if line.strip() and not line.startswith("#")]


def instructions(name: str) -> list[str]:
    return [args for op, args in dockerfile() if op == name]


def test_every_variable_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    names = {env_name(name) for name, _ in settings_fields(ConsumerSettings)}
    for var in container()["env"]:
        assert var["name"] in names, f"{var['name']} is no setting of consumerkit run"
    settings = manifest_settings(monkeypatch)
    assert settings.kafka.bootstrap == "kafka-0.kafka:9092,kafka-1.kafka:9092"
    assert settings.dsn() == SECRET_DSN


def test_the_ports_are_the_metrics_port(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = manifest_settings(monkeypatch)
    assert settings.metrics.port is not None  # without it, no probe would be answered
    # the kubelet and Prometheus reach the pod's address, not its loopback
    assert settings.metrics.host == "0.0.0.0"
    c = container()
    (port,) = c["ports"]
    assert port["containerPort"] == settings.metrics.port
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["port"] in (port["name"], port["containerPort"]), probe
    annotations = deployment()["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == settings.metrics.port
    assert instructions("EXPOSE") == [str(settings.metrics.port)]


async def test_the_probe_paths_are_answered_by_the_health_server() -> None:
    liveness, readiness = probe_paths()
    metrics = deployment()["spec"]["template"]["metadata"]["annotations"]["prometheus.io/path"]
    reason: list[str | None] = ["waiting to join consumer group billing"]

    async def ready() -> str | None:
        return reason[0]

    server = HealthServer(CollectorRegistry(), ready, host="127.0.0.1", port=0)
    await server.start()
    try:
        assert await get(server.port, liveness) == 200  # alive while the loop answers
        assert await get(server.port, readiness) == 503  # not ready: out of the service
        assert await get(server.port, metrics) == 200
        reason[0] = None
        assert await get(server.port, readiness) == 200
        assert await get(server.port, "/no-such-probe") == 404  # a wrong path would show
    finally:
        await server.close()


async def get(port: int, path: str) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: pod\r\n\r\n".encode())
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), 10)
    finally:
        writer.close()
    return int(status.split()[1])


def test_the_grace_period_outlasts_the_drain(monkeypatch: pytest.MonkeyPatch) -> None:
    consumer: Consumer = load_app().consumer
    drain = max(consumer.shutdown_timeout, manifest_settings(monkeypatch).timeouts.shutdown)
    grace = deployment()["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= drain + GRACE_MARGIN, (grace, drain)


def test_the_image_copies_what_the_service_has() -> None:
    copied = [args.split() for args in instructions("COPY")]
    assert copied
    for *sources, _target in copied:
        for source in sources:
            assert (SERVICE / source).exists(), f"COPY {source}: not in examples/service/"
    service = tomllib.loads((SERVICE / "pyproject.toml").read_text())
    packages = service["tool"]["setuptools"]["packages"]
    assert {s for *sources, _ in copied for s in sources} >= {"pyproject.toml", *packages}
    assert any("pip install" in args and " ." in args for args in instructions("RUN"))
    (base,) = instructions("FROM")
    version = re.search(r"python:(\d+)\.(\d+)", base)
    assert version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    low = re.search(r">=(\d+)\.(\d+)", project["requires-python"])
    assert low
    assert tuple(map(int, version.groups())) >= tuple(map(int, low.groups()))
    (user,) = instructions("USER")
    assert user not in ("root", "0")


def test_the_entrypoint_runs_the_service_consumer() -> None:
    (entrypoint,) = [json.loads(a) for a in instructions("ENTRYPOINT")]  # exec form: PID 1
    (cmd,) = [json.loads(a) for a in instructions("CMD")]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert entrypoint[0] in scripts
    for extra in (cmd, container()["args"]):  # the image's arguments, and the manifest's
        args = _parser().parse_args([*entrypoint[1:], *extra])
        assert args.command == "run"
        module, _, attr = args.target.partition(":")
        assert module == "billing.app"
        assert (SERVICE / "billing" / "app.py").exists()
        assert isinstance(getattr(load_app(), attr), Consumer)


def test_the_migration_job_runs_migrate_with_the_same_image() -> None:
    documents = list(yaml.safe_load_all((SERVICE / "kubernetes.yaml").read_text()))
    (job,) = [d for d in documents if d["kind"] == "Job"]
    (step,) = job["spec"]["template"]["spec"]["containers"]
    assert step["image"] == container()["image"]
    args = _parser().parse_args(step["command"][1:])
    assert args.command == "migrate"
    names = {env_name(name) for name, _ in settings_fields(ConsumerSettings)}
    assert {var["name"] for var in step["env"]} <= names
