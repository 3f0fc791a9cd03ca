"""docs/service.md as a newcomer follows it: its commands, as the page shows them, run from
``examples/service/`` (the service's folder) against the test broker and PostgreSQL; the
consumer that ``consumerkit run billing.app:consumer`` loads becomes ready, applies a
published ``order.created`` once, and drains on SIGTERM. The page's install lines name only
extras consumerkit has, and its layout only files the service has."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import shlex
import signal
import socket
import sys
import tomllib
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import asyncpg
import orjson
import pytest
import yaml

from consumerkit.transport.kafka import KafkaProducer

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "service.md"
SERVICE = ROOT / "examples" / "service"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
VARIABLES = {"CONSUMERKIT_KAFKA_BOOTSTRAP", "CONSUMERKIT_POSTGRES_DSN"}


def blocks(language: str) -> list[str]:
    return [m.group(2) for m in FENCE.finditer(PAGE.read_text()) if m.group(1) == language]


def run_block() -> list[str]:
    """The lines of the page's block that ends in ``consumerkit run``."""
    (block,) = [b for b in blocks("bash") if "consumerkit run " in b]
    return block.strip().splitlines()


def load_app() -> ModuleType:
    spec = importlib.util.spec_from_file_location("billing_service_app",
                                                  SERVICE / "billing" / "app.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def deployment() -> dict[str, Any]:
    documents = list(yaml.safe_load_all((SERVICE / "kubernetes.yaml").read_text()))
    (found,) = [d for d in documents if d["kind"] == "Deployment"]
    return found  # type: ignore[no-any-return]


def container() -> dict[str, Any]:
    (found,) = deployment()["spec"]["template"]["spec"]["containers"]
    return found  # type: ignore[no-any-return]


def probe_paths() -> tuple[str, str]:
    """(liveness, readiness) paths of the manifest."""
    c = container()
    return c["livenessProbe"]["httpGet"]["path"], c["readinessProbe"]["httpGet"]["path"]


def with_search_path(dsn: str, schema: str) -> str:
    return f"{dsn}{'&' if '?' in dsn else '?'}search_path={schema}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def environment(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONSUMERKIT_")}
    return {**env, **extra}


def consumerkit(argv: list[str]) -> list[str]:
    """``consumerkit ...`` as this interpreter runs it (the venv's script need not be on
    PATH)."""
    assert argv[0] == "consumerkit"
    return [sys.executable, "-m", "consumerkit", *argv[1:]]


async def probe(port: int, path: str) -> tuple[int, str]:
    def get() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError as e:
            return 0, str(e)
    return await asyncio.to_thread(get)


def test_the_install_lines_name_real_extras() -> None:
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["project"]["optional-dependencies"])
    lines = [line for b in blocks("bash") for line in b.splitlines()
             if line.startswith("pip install")]
    assert len(lines) == 2
    service = tomllib.loads((SERVICE / "pyproject.toml").read_text())["project"]
    named = [*service["dependencies"], *service["optional-dependencies"]["test"]]
    for requirement in [arg for line in lines for arg in shlex.split(line)[2:]] + named:
        name, _, rest = requirement.partition("[")
        if name == "consumerkit":
            assert set(rest.rstrip("]").split(",")) - {""} <= extras, requirement
        else:
            assert name in ("pytest", "pytest-asyncio"), requirement
    assert "consumerkit" in service["dependencies"]


def tree_paths(tree: str) -> list[str]:
    """The files of a ``tree``-style listing, as paths under its top folder."""
    folders: list[tuple[int, str]] = []  # (indent, name) of the folders open at this line
    paths = []
    for line in tree.splitlines()[1:]:
        indent = len(re.match(r"^[│├└─\s]*", line).group(0))  # type: ignore[union-attr]
        name = line[indent:]
        folders = [(i, f) for i, f in folders if i < indent]
        if name.endswith("/"):
            folders.append((indent, name))
        else:
            paths.append("".join(f for _, f in folders) + name)
    return sorted(paths)


def test_the_layout_is_the_service_folder() -> None:
    assert tree_paths("top/\n├── a\n└── d/\n    └── b\n") == ["a", "d/b"]
    (tree,) = blocks("text")
    files = sorted(p.relative_to(SERVICE).as_posix() for p in SERVICE.rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts)
    assert tree_paths(tree) == files


@pytest.mark.slow
async def test_the_pages_commands_run_the_service(
    postgres_dsn: str, pg_schema: str, kafka_bootstrap: str,
) -> None:
    lines = run_block()
    exported = {line.split()[1].split("=")[0] for line in lines if line.startswith("export ")}
    assert exported == VARIABLES  # the test gives those two its own services
    commands = [shlex.split(line) for line in lines if line.startswith("consumerkit ")]
    assert [c[:2] for c in commands] == [["consumerkit", "migrate"],
                                         ["consumerkit", "topics"], ["consumerkit", "check"],
                                         ["consumerkit", "run"]]
    dsn = with_search_path(postgres_dsn, pg_schema)  # the service's own table goes there
    port = free_port()
    liveness, readiness = probe_paths()  # the manifest's probes, on the live consumer
    env = environment({"CONSUMERKIT_KAFKA_BOOTSTRAP": kafka_bootstrap,
                       "CONSUMERKIT_POSTGRES_DSN": dsn, "CONSUMERKIT_METRICS_PORT": str(port)})
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'CREATE SCHEMA "{pg_schema}"')
        await conn.execute(load_app().SCHEMA_SQL)  # the service's migration
        for argv in commands[:-1]:
            proc = await asyncio.create_subprocess_exec(
                *consumerkit(argv), cwd=SERVICE, env=env,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), 120)
            assert proc.returncode == 0, f"{shlex.join(argv)}: {out.decode()}{err.decode()}"
        run = await asyncio.create_subprocess_exec(
            *consumerkit(commands[-1]), cwd=SERVICE, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            async with asyncio.timeout(90):
                while (await probe(port, readiness))[0] != 200:
                    assert run.returncode is None, "consumerkit run exited before it was ready"
                    await asyncio.sleep(0.2)
            order = f"o-{uuid.uuid4().hex[:8]}"
            producer = KafkaProducer(kafka_bootstrap, {"enable_idempotence": False})
            await producer.start()
            try:
                for _ in range(2):  # the same event twice: applied once
                    await producer.send(
                        "orders", key=order.encode(),
                        value=orjson.dumps({"order_id": order, "amount": 42}),
                        headers=[("id", f"evt-{order}".encode()),
                                 ("event_type", b"order.created")])
            finally:
                await producer.stop()
            metric = re.compile(r'^consumerkit_messages_total\{consumer="billing",'
                                r'outcome="duplicate",topic="orders"\} (\S+)$', re.MULTILINE)
            async with asyncio.timeout(60):  # applied, and its copy absorbed
                while await conn.fetchval("SELECT amount FROM charges WHERE order_id = $1",
                                          order) is None or not (
                        found := metric.search((await probe(port, "/metrics"))[1])) or float(
                        found.group(1)) < 1:
                    await asyncio.sleep(0.1)
            assert (await probe(port, liveness))[0] == 200
        finally:
            if run.returncode is None:
                run.send_signal(signal.SIGTERM)
            out, err = await asyncio.wait_for(run.communicate(), 60)
        assert run.returncode == 0, err.decode()
        assert "Traceback" not in err.decode()
        assert await conn.fetchval("SELECT amount FROM charges WHERE order_id = $1", order) == 42
    finally:
        await conn.close()
