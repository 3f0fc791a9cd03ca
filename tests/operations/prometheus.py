"""A real Prometheus server for the tests: started on a free loopback port with the scrape
configuration that docs/operations/alerts.md shows, the rule file, and 1 s intervals."""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from consumerkit.testing.services import free_port

from .conftest import ALERTS, OPERATIONS

START_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0


def documented_config() -> dict[str, Any]:
    """The ```yaml block of docs/operations/alerts.md that configures Prometheus."""
    page = (OPERATIONS / "alerts.md").read_text()
    blocks = re.findall(r"^```yaml\n(.*?)^```", page, re.MULTILINE | re.DOTALL)
    [block] = [b for b in blocks if "scrape_configs:" in b]
    config: dict[str, Any] = yaml.safe_load(block)
    return config


def server_config(targets: Sequence[str]) -> dict[str, Any]:
    """The documented configuration, scraping ``targets`` every second with the rule file."""
    config = documented_config()
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(ALERTS)]
    [job] = config["scrape_configs"]
    job["static_configs"] = [{"targets": list(targets)}]
    return config


class PrometheusApi:
    """The HTTP API of a running server."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = httpx.AsyncClient(base_url=url, timeout=5)

    async def get(self, path: str, **params: str) -> Any:
        response = await self.client.get(path, params=params)
        body = response.json()
        assert body["status"] == "success", body
        return body["data"]

    async def query(self, expr: str) -> list[dict[str, Any]]:
        data = await self.get("/api/v1/query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result

    async def alerts(self, name: str) -> list[dict[str, Any]]:
        """The alerts named ``name``, pending or firing."""
        data = await self.get("/api/v1/alerts")
        return [a for a in data["alerts"] if a["labels"]["alertname"] == name]

    async def evaluations(self, group: str) -> str | None:
        """When the rule group ``group`` was last evaluated (RFC 3339), or None."""
        data = await self.get("/api/v1/rules")
        for found in data["groups"]:
            if found["name"] == group:
                last = found.get("lastEvaluation")
                return None if last is None or last.startswith("0001-") else str(last)
        raise AssertionError(f"no rule group {group}")


@contextlib.asynccontextmanager
async def running_prometheus(binary: str, workdir: Path,
                             targets: Sequence[str]) -> AsyncIterator[PrometheusApi]:
    """Run ``binary`` scraping ``targets`` until the block ends; fail with its log if it does
    not become ready."""
    config = workdir / "prometheus.yml"
    config.write_text(yaml.safe_dump(server_config(targets)))
    log_path = workdir / "prometheus.log"
    port = free_port()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT)
    api = PrometheusApi(f"http://127.0.0.1:{port}")
    try:
        await _wait_ready(api, process, log_path)
        yield api
    finally:
        await api.client.aclose()
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_TIMEOUT)


async def _wait_ready(api: PrometheusApi, process: subprocess.Popen[bytes],
                      log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"prometheus exited with {process.returncode}:\n"
                                 f"{_tail(log_path)}")
        with contextlib.suppress(httpx.TransportError):
            if (await api.client.get("/-/ready")).status_code == 200:
                return
        await asyncio.sleep(0.1)
    raise AssertionError(f"prometheus not ready after {START_TIMEOUT}s:\n{_tail(log_path)}")


def _tail(log_path: Path) -> str:
    return log_path.read_text(errors="replace")[-3000:]
