"""Why the broker said no, in one line naming what is missing: a refused SASL login or TLS
handshake, a missing ACL, a refused idempotent producer.

aiokafka reports a refused login as "Unable to bootstrap" (the reason only in a log line), and
a consumer whose principal may not describe a topic sees it as absent. These helpers ask once
more, directly, to tell those apart from a broker that is down or a topic that does not exist.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.conn import create_conn
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    UnsupportedSaslMechanismError,
)
from aiokafka.protocol.metadata import MetadataRequest

from ..errors import AuthorizationError, IdempotenceRefusedError

_TOPIC_DENIED = TopicAuthorizationFailedError.errno
TOPIC_GRACE = 5.0
"""Seconds a topic missing at start-up is waited for: one created a moment before (a topic
operator racing the deployment) may not be in the metadata of every broker yet."""
_CONNECTION = set(inspect.signature(create_conn).parameters) - {"host", "port"}


async def missing_topics(
    read: Callable[[], Awaitable[Collection[str]]], wanted: Collection[str],
    log: logging.Logger,
    hidden: Callable[[list[str]], Awaitable[Collection[str]]] | None = None,
) -> list[str]:
    """The topics of ``wanted`` that the metadata ``read`` returns still lacks after
    :data:`TOPIC_GRACE` seconds (asked again every fraction of a second meanwhile; the wait
    is told to ``log`` once). Not waited for when ``hidden`` says the broker denies them
    all to this principal: they exist, and no wait would show them."""
    grace = TOPIC_GRACE
    deadline = time.monotonic() + grace
    delay = 0.1
    while True:
        missing = sorted(set(wanted) - set(await read()))
        left = deadline - time.monotonic()
        if not missing or left <= 0:
            return missing
        if delay == 0.1:
            if hidden is not None and set(missing) <= set(await hidden(missing)):
                return missing
            log.info("topics not on the broker yet: %s; waiting up to %.0fs for them",
                     ", ".join(missing), grace)
        await asyncio.sleep(min(delay, left))
        delay = min(delay * 2, 1.0)


def principal(options: Mapping[str, Any]) -> str:
    """Who the client is to the broker, as a message names it."""
    user = options.get("sasl_plain_username")
    return f"user {user!r}" if user else "this client (no SASL user)"


async def login_failure(bootstrap: str, options: Mapping[str, Any],
                        timeout: float = 10.0) -> str | None:
    """Why a client with ``options`` cannot log in to the first of ``bootstrap``'s brokers
    (``None``: it can, or the broker does not answer at all, which is an outage)."""
    if options.get("security_protocol", "PLAINTEXT") == "PLAINTEXT":
        return None  # no login, no handshake: nothing to refuse
    host, _, port = bootstrap.split(",")[0].strip().rpartition(":")
    settings = {k: v for k, v in options.items() if k in _CONNECTION}
    try:
        async with asyncio.timeout(timeout):
            conn = await create_conn(host, int(port), **settings)
    except SaslAuthenticationFailed:
        return (f"the Kafka broker at {bootstrap} refused the SASL login of "
                f"{principal(options)} ({options.get('sasl_mechanism')}): wrong user name or "
                "password (sasl_plain_username, sasl_plain_password)")
    except UnsupportedSaslMechanismError as exc:
        return f"the Kafka broker at {bootstrap} refused the SASL mechanism: {exc}"
    except ssl.SSLCertVerificationError as exc:
        return (f"the Kafka broker at {bootstrap} has a TLS certificate that does not verify "
                f"({exc.verify_message}): give the CA that signed it (ssl_cafile)")
    except ssl.SSLError as exc:
        return f"the TLS handshake with the Kafka broker at {bootstrap} failed: {exc}"
    except (OSError, KafkaError, TimeoutError, ValueError):
        return None
    conn.close()
    return None


async def describe_topics(admin: AIOKafkaAdminClient, topics: Sequence[str]) -> list[Any]:
    """The metadata of ``topics``, asked so that the broker creates none of them: the admin
    client's ``describe_topics`` lets a broker with ``auto.create.topics.enable`` (Kafka's
    default, and Tansu) create every missing topic it names."""
    request = MetadataRequest(list(topics), allow_auto_topic_creation=False)
    response = await admin._send_request(request)
    return list(response.to_object()["topics"])


async def hidden_topics(bootstrap: str, topics: Sequence[str], options: Mapping[str, Any],
                        timeout: float = 10.0) -> list[str]:
    """Those of ``topics`` (absent from the client's topic list) that the broker denies to
    describe to this principal, rather than lacks."""
    accepted = set(inspect.signature(AIOKafkaAdminClient).parameters)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **{
        **{k: v for k, v in options.items() if k in accepted},
        "request_timeout_ms": int(timeout * 1000)})
    try:
        async with asyncio.timeout(timeout):
            await admin.start()
            described = await describe_topics(admin, topics)
    except (KafkaError, OSError, TimeoutError):
        return []
    finally:
        await admin.close()
    return sorted(t["topic"] for t in described if t["error_code"] == _TOPIC_DENIED)


def denied(exc: GroupAuthorizationFailedError | TopicAuthorizationFailedError,
           options: Mapping[str, Any], *, group: str | None = None,
           topics: Iterable[str] = ()) -> AuthorizationError:
    """A consumer's missing ACL, named: READ on its group or on its topics."""
    who = principal(options)
    if isinstance(exc, GroupAuthorizationFailedError):
        return AuthorizationError(
            f"the Kafka broker denied {who} the consumer group {group!r} "
            "(GROUP_AUTHORIZATION_FAILED): it needs an ACL allowing READ on that group")
    names = ", ".join(sorted(topics)) or str(exc)
    return AuthorizationError(
        f"the Kafka broker denied {who} the topics {names} (TOPIC_AUTHORIZATION_FAILED): it "
        "needs an ACL allowing READ on each")


def write_denied(topic: str, options: Mapping[str, Any]) -> str:
    """A producer's missing ACL, named: WRITE on ``topic``."""
    return (f"the Kafka broker denied {principal(options)} the topic {topic} "
            "(TOPIC_AUTHORIZATION_FAILED): it needs an ACL allowing WRITE on it")


def idempotence_refused(bootstrap: str, exc: KafkaError,
                        options: Mapping[str, Any]) -> IdempotenceRefusedError:
    """What the broker's refusal of ``InitProducerId`` means: a right missing, or no
    idempotent producer on that broker at all."""
    answer = f"InitProducerId answered {type(exc).__name__}"
    if isinstance(exc, ClusterAuthorizationFailedError | TransactionalIdAuthorizationFailed):
        return IdempotenceRefusedError(
            f"the Kafka broker at {bootstrap} refused the idempotent producer to "
            f"{principal(options)} ({answer}): it needs an ACL allowing WRITE on the topics "
            "it publishes to (or IDEMPOTENT_WRITE on the cluster)", denied=True)
    return IdempotenceRefusedError(
        f"the Kafka broker at {bootstrap} answered but refused the idempotent producer "
        f"({answer}), as a broker without one does (Tansu, for one)", denied=False)
