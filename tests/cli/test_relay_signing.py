"""``consumerkit relay --webhook-url`` signs its requests with the secrets of its settings
(``--webhook-secret``, ``CONSUMERKIT_WEBHOOK_SECRETS``): each verifies with the reference
implementation, and no secret appears in any output."""

from __future__ import annotations

import base64
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import asyncpg
import orjson
import pytest
from standardwebhooks import Webhook

from consumerkit.outbox import Outbox
from consumerkit.settings import RelaySettings

from ..outbox.conftest import wait_until
from .conftest import cli, start, terminate, with_password


def new_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(24)).decode()


NEW, OLD = new_secret(), new_secret()


class SignedHook(BaseHTTPRequestHandler):
    """Records each POST's headers and body."""

    seen: ClassVar[list[tuple[dict[str, str], bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        SignedHook.seen.append(({k.lower(): v for k, v in self.headers.items()}, body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # quiet
        return None


async def test_relay_signs_webhooks_that_standardwebhooks_verifies(
    tmp_path: Path, postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool,
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), SignedHook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    SignedHook.seen.clear()
    try:
        env = {"CONSUMERKIT_POSTGRES_DSN": with_password(postgres_dsn),
               "CONSUMERKIT_POSTGRES_SCHEMA": pg_schema}
        assert (await cli("migrate", cwd=tmp_path, env=env)).code == 0
        async with pg_pool.acquire() as conn, conn.transaction():
            for n in range(3):
                await Outbox(pg_schema).add(conn, event_type="order.placed",
                                            aggregate_type="order", aggregate_id=f"o-{n}",
                                            payload={"n": n})
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        proc = await start("relay", "--webhook-url", url, "--webhook-secret", NEW,
                           "--webhook-secret", OLD, "--log-level", "debug",
                           cwd=tmp_path, env=env)

        async def delivered() -> bool:
            return len(SignedHook.seen) >= 3

        await wait_until(delivered, 60, "three webhook deliveries")
        done = await terminate(proc)
    finally:
        server.shutdown()
        server.server_close()
    assert done.code == 0, done.err
    for headers, body in SignedHook.seen:
        assert len(headers["webhook-signature"].split(" ")) == 2  # one per secret
        for secret in (NEW, OLD):  # each alone verifies it (rotation)
            assert Webhook(secret).verify(body, headers) == orjson.loads(body)
        with pytest.raises(Exception, match="No matching signature"):
            Webhook(new_secret()).verify(body, headers)
    for secret in (NEW, OLD):
        assert secret not in done.output
        assert secret.removeprefix("whsec_") not in done.output


async def test_config_shows_the_secrets_from_the_variable_redacted(tmp_path: Path) -> None:
    env = {"CONSUMERKIT_WEBHOOK_SECRETS": f"{NEW} {OLD}"}
    done = await cli("config", "relay", cwd=tmp_path, env=env)
    assert done.code == 0, done.err
    [row] = [line for line in done.out.splitlines() if line.startswith("webhook_secrets")]
    assert row.split()[1:3] == ["env", "CONSUMERKIT_WEBHOOK_SECRETS"]
    assert row.endswith("[**********, **********]")
    assert NEW not in done.output
    assert OLD not in done.output


# fixed ids: the secrets are random, and every xdist worker must collect the same test names
@pytest.mark.parametrize("text", [f"{NEW} {OLD}", f"  {NEW}\n{OLD} ",
                                  orjson.dumps([NEW, OLD]).decode()],
                         ids=["spaces", "lines", "json-list"])
def test_webhook_secrets_read_from_spaces_or_a_json_list(
    text: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONSUMERKIT_WEBHOOK_SECRETS", text)
    settings = RelaySettings(_env_file=None)
    assert [s.get_secret_value() for s in settings.webhook_secrets] == [NEW, OLD]
    for shown in (repr(settings), str(settings), settings.model_dump_json()):
        assert NEW not in shown
        assert OLD not in shown
    assert NEW in settings.secret_values()
    assert OLD in settings.secret_values()


async def test_a_malformed_secret_is_one_line_without_its_value(
    tmp_path: Path, postgres_dsn: str, pg_schema: str,
) -> None:
    env = {"CONSUMERKIT_POSTGRES_DSN": postgres_dsn, "CONSUMERKIT_POSTGRES_SCHEMA": pg_schema}
    assert (await cli("migrate", cwd=tmp_path, env=env)).code == 0
    bad = "whsec_not*base64*but-secret-looking"
    done = await cli("relay", "--webhook-url", "http://127.0.0.1:1/", "--webhook-secret", bad,
                     cwd=tmp_path, env=env)
    assert done.code == 1
    assert done.err.strip() == ("consumerkit: a webhook secret must be whsec_ followed by "
                                "base64")
    assert "not*base64" not in done.output
