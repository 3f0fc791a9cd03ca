"""TLS, SASL/SCRAM-SHA-512 and ACLs for the Apache Kafka test cluster.

``start_kafka(security=KafkaSecurity({"billing": "...", ...}))`` gives every node a third
listener, ``SECURE`` (SASL_SSL), on a port of its own: a server certificate for 127.0.0.1
signed by a CA made for the cluster (``openssl``), SCRAM-SHA-512 credentials for each user,
created when the log dirs are formatted (``StorageTool format --add-scram``), and the
``StandardAuthorizer`` with no access where no ACL allows it. :meth:`KafkaSecurity.grant`
creates ACLs; :meth:`KafkaSecurity.client_options` are a user's aiokafka options.

The PLAINTEXT and CONTROLLER listeners stay, for the brokers among themselves and for the test
harness (readiness, lookups, ACLs): their principal, ``User:ANONYMOUS``, is a super user. They
listen on loopback only; a production cluster authenticates those listeners too.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import ssl
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.admin import CreateAclsRequest

from consumerkit.testing._common import ServiceStartError

from .kafka_jars import MissingToolError

MECHANISM = "SCRAM-SHA-512"
LISTENER = "SECURE"
ADMIN = "admin"
_CERT_DAYS = "2"
_TOOL_TIMEOUT = 60.0

# Kafka's wire codes (org.apache.kafka.common.acl / resource)
RESOURCE = {"topic": 2, "group": 3, "cluster": 4, "transactional_id": 5}
OPERATION = {"read": 3, "write": 4, "create": 5, "delete": 6, "alter": 7, "describe": 8,
             "describe_configs": 10, "idempotent_write": 12}
_LITERAL, _PREFIXED, _ALLOW = 3, 4, 3


@dataclass(frozen=True, slots=True)
class Acl:
    """Allow ``principal`` (a user name) ``operation`` on a resource: ``resource`` is
    ``topic``, ``group``, ``cluster`` or ``transactional_id``; ``name`` ends with ``*`` for a
    prefix (the cluster's name is ``kafka-cluster``)."""

    principal: str
    operation: str
    resource: str
    name: str


@dataclass
class KafkaSecurity:
    """The SASL_SSL listener's users (name -> password; an ``admin`` super user is added)."""

    users: Mapping[str, str]
    admin_password: str = field(default_factory=lambda: secrets.token_urlsafe(18))
    ports: dict[int, int] = field(default_factory=dict)  # node id -> SECURE port
    ca_file: Path | None = None

    @property
    def bootstrap(self) -> str:
        """The SECURE listener of every node."""
        return ",".join(f"127.0.0.1:{port}" for _, port in sorted(self.ports.items()))

    def credentials(self) -> dict[str, str]:
        return {ADMIN: self.admin_password, **self.users}

    def prepare(self, workdir: Path, ports: Mapping[int, int]) -> None:
        """Make the CA and the server certificate in ``workdir``; remember each node's port."""
        self.ports = dict(ports)
        self.ca_file = make_certificates(workdir / "tls")

    def node_properties(self, node_id: int, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` (a node's server.properties) with the SECURE listener and the authorizer."""
        assert self.ca_file is not None, "prepare() first"
        tls = self.ca_file.parent
        secure = f"{LISTENER}://127.0.0.1:{self.ports[node_id]}"
        jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        return {
            **base,
            "listeners": f"{base['listeners']},{secure}",
            "advertised.listeners": f"{base['advertised.listeners']},{secure}",
            "listener.security.protocol.map": (
                f"{base['listener.security.protocol.map']},{LISTENER}:SASL_SSL"),
            "sasl.enabled.mechanisms": MECHANISM,
            f"listener.name.{LISTENER.lower()}.sasl.enabled.mechanisms": MECHANISM,
            f"listener.name.{LISTENER.lower()}.{MECHANISM.lower()}.sasl.jaas.config": jaas,
            f"listener.name.{LISTENER.lower()}.ssl.keystore.type": "PEM",
            f"listener.name.{LISTENER.lower()}.ssl.keystore.location": str(tls / "server.pem"),
            "authorizer.class.name":
                "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": f"User:ANONYMOUS;User:{ADMIN}",
            "allow.everyone.if.no.acl.found": "false",
        }

    def format_arguments(self) -> list[str]:
        """``StorageTool format`` arguments creating every user's SCRAM credentials."""
        args: list[str] = []
        for name, password in self.credentials().items():
            if any(c in name + password for c in ",=[]\"' "):
                raise ValueError(f"SCRAM user {name!r}: no , = [ ] quotes or spaces")
            args += ["--add-scram", f"{MECHANISM}=[name={name},password={password}]"]
        return args

    def client_options(self, user: str, password: str | None = None) -> dict[str, Any]:
        """aiokafka options for ``user`` on the SECURE listener (its own password unless
        ``password`` is given: a wrong one, say)."""
        assert self.ca_file is not None
        return {"security_protocol": "SASL_SSL", "sasl_mechanism": MECHANISM,
                "sasl_plain_username": user,
                "sasl_plain_password": self.credentials()[user] if password is None
                else password,
                "ssl_context": ssl.create_default_context(cafile=str(self.ca_file))}

    async def grant(self, plaintext_bootstrap: str, acls: Sequence[Acl]) -> None:
        """Create ``acls`` through the PLAINTEXT listener (a super user's)."""
        admin = AIOKafkaAdminClient(bootstrap_servers=plaintext_bootstrap,
                                    request_timeout_ms=30_000)
        await asyncio.wait_for(admin.start(), 30)
        try:
            for acl in acls:
                prefixed = acl.name.endswith("*") and acl.resource != "cluster"
                request = CreateAclsRequest(
                    RESOURCE[acl.resource], acl.name.rstrip("*") if prefixed else acl.name,
                    _PREFIXED if prefixed else _LITERAL, f"User:{acl.principal}", "*",
                    OPERATION[acl.operation], _ALLOW)
                response = await asyncio.wait_for(admin._send_request(request), 30)
                for error_code, message in response.creation_responses:
                    if error_code:
                        raise ServiceStartError(f"creating ACL {acl} failed: {message}")
        finally:
            await admin.close()


def make_certificates(directory: Path) -> Path:
    """A CA and a server certificate for 127.0.0.1 signed by it (``server.pem``: the key and
    the chain, Kafka's PEM key store); returns the CA's file."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise MissingToolError("the TLS listener needs openssl: apt-get install openssl")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    steps = [
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
         "ca.crt", "-days", _CERT_DAYS, "-subj", "/CN=consumerkit test CA"],
        ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
         "server.csr", "-subj", "/CN=127.0.0.1"],
        ["x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
         "-CAcreateserial", "-out", "server.crt", "-days", _CERT_DAYS, "-extfile",
         "server.ext"],
    ]
    for step in steps:
        done = subprocess.run([openssl, *step], cwd=directory, capture_output=True,
                              timeout=_TOOL_TIMEOUT, check=False)
        if done.returncode != 0:
            raise ServiceStartError(f"openssl {step[0]} failed: "
                                    f"{done.stderr.decode(errors='replace')[-2000:]}")
    (directory / "server.pem").write_text(
        "".join((directory / f).read_text() for f in ("server.key", "server.crt", "ca.crt")))
    return directory / "ca.crt"
