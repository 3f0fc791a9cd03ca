"""``consumerkit check``'s broker: reachable, every topic present and readable, each topic's
durability and retention against the dedup window, and the relay's idempotent producer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..dedup.horizon import Finding, redelivery_horizon_check
from ..errors import ConsumerKitError
from ..transport.kafka import KafkaProducer
from ..transport.kafka_access import hidden_topics, principal
from .check_deployment import Deployment, Report
from .check_kafka import durability_findings, idempotence_finding, topic_durability
from .errors import one_line


async def check_broker(d: Deployment, report: Report) -> None:
    if d.bootstrap is None:
        if d.topics:
            report.problem("topics given but no broker: pass --kafka or set "
                           "CONSUMERKIT_KAFKA_BOOTSTRAP")
        else:
            report.note("broker not checked: pass --kafka or set CONSUMERKIT_KAFKA_BOOTSTRAP")
        return
    known = await broker_topics(d.bootstrap, d.kafka_options, report)
    if known is None:
        return
    wanted = list(dict.fromkeys([*d.topics, *d.published]))
    missing = sorted(set(wanted) - known)
    hidden = await hidden_topics(d.bootstrap, missing, d.kafka_options) if missing else []
    if hidden:  # the topic list leaves out what the principal may not describe
        report.problem(f"topics denied to {principal(d.kafka_options)}: {', '.join(hidden)} "
                       "(TOPIC_AUTHORIZATION_FAILED, which a broker also answers for a topic "
                       "it has not, to whoever may not describe it): it needs an ACL allowing "
                       "READ on each it consumes, WRITE on each it publishes to")
    if absent := [t for t in missing if t not in hidden]:
        report.problem(f"topics missing on the broker: {', '.join(absent)}")
    # durability: a "warning" may be deliberate (a development cluster), an "error" is not
    durability: list[Finding] = []
    relay = await idempotence_finding(d.bootstrap, d.kafka_options, d.idempotence) if (
        d.published) else None
    durability += [relay] if relay is not None else []
    present = [t for t in wanted if t in known]
    if present:
        report.ok(f"topics present: {', '.join(present)}")
        durability += durability_findings(
            await topic_durability(d.bootstrap, present, d.kafka_options),
            replication=d.replication)
    for finding in durability:
        {"unknown": report.note, "warning": report.warn}.get(
            finding.level, report.problem)(finding.message)
    consumed = [t for t in d.topics if t in known]
    if consumed:
        for finding in await redelivery_horizon_check(
                d.policy, topics=consumed, kafka_bootstrap=d.bootstrap, retry=d.retry,
                handler_timeout=d.handler_timeout, kafka_options=d.kafka_options):
            (report.note if finding.level == "unknown" else report.problem)(finding.message)


async def broker_topics(bootstrap: str, options: Mapping[str, Any],
                        report: Report) -> set[str] | None:
    """The broker's topics, or None (and a problem) when it cannot be reached."""
    try:
        topics = await reach_broker(bootstrap, options)
    except ConsumerKitError as exc:
        report.problem(one_line(exc) or str(exc))
        return None
    report.ok(f"Kafka broker at {bootstrap} answers")
    return topics


async def reach_broker(bootstrap: str, options: Mapping[str, Any]) -> set[str]:
    """The broker's topics; :class:`StartupError` when it cannot be reached."""
    producer = KafkaProducer(bootstrap, {**options, "enable_idempotence": False})
    try:
        await producer.start()
        return await producer.topics()
    finally:
        await producer.stop()
