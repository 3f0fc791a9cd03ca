"""Will the cluster keep what it acknowledged? The Kafka half of ``consumerkit check``.

Each consumed or published topic: its replication factor (at least ``--min-replication``, 3
by default), ``min.insync.replicas`` (at least 2, or the replication wanted when that is
less) and ``unclean.leader.election.enable`` (off). With published topics, the relay's
idempotent producer: on wherever the broker grants it, off where the broker refuses it. A
broker that cannot say (Tansu describes no topic config) gives one ``unknown`` line naming
what could not be verified, never an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..dedup.horizon import Finding
from ..errors import IdempotenceRefusedError, StartupError
from ..settings import env_name, flag
from ..transport.kafka import KafkaProducer
from ..transport.kafka_admin import describe_replication, describe_topic_configs

MIN_INSYNC = "min.insync.replicas"
UNCLEAN = "unclean.leader.election.enable"
WANTED_REPLICATION = 3
WANTED_MIN_INSYNC = 2


@dataclass(frozen=True, slots=True)
class TopicDurability:
    """What the broker says of one topic (``None``: it did not say)."""

    replication: int | None
    min_insync: int | None
    unclean: bool | None


def durability_findings(topics: Mapping[str, TopicDurability], *,
                        replication: int = WANTED_REPLICATION) -> list[Finding]:
    """A ``warning`` per setting that can lose an acknowledged record, then one ``unknown``
    line for what the broker did not say."""
    wanted_insync = min(WANTED_MIN_INSYNC, replication)
    findings: list[Finding] = []
    unknown: dict[str, list[str]] = {}
    for topic, seen in sorted(topics.items()):
        if seen.replication is None:
            unknown.setdefault("replication factor", []).append(topic)
        elif seen.replication < replication:
            findings.append(Finding("warning", (
                f"topic {topic} has replication factor {seen.replication}, under "
                f"{replication}: losing {'its broker' if seen.replication == 1 else 'brokers'} "
                "loses records already acknowledged")))
        if seen.min_insync is None:
            unknown.setdefault(MIN_INSYNC, []).append(topic)
        elif seen.min_insync < wanted_insync:
            findings.append(Finding("warning", (
                f"topic {topic} has {MIN_INSYNC}={seen.min_insync}, under {wanted_insync}: "
                f"acks=all is then satisfied by {seen.min_insync} broker"
                f"{'' if seen.min_insync == 1 else 's'}, whose loss loses the record")))
        if seen.unclean is None:
            unknown.setdefault(UNCLEAN, []).append(topic)
        elif seen.unclean:
            findings.append(Finding("warning", (
                f"topic {topic} has {UNCLEAN}=true: a replica that missed acknowledged "
                "records can become leader, and those records are lost; set it to false")))
    if unknown:
        missing = "; ".join(f"{what} of {', '.join(names)}" for what, names in unknown.items())
        findings.append(Finding("unknown", f"not verified, the broker did not describe them: "
                                f"{missing}"))
    return findings


async def topic_durability(bootstrap: str, topics: Sequence[str],
                           options: Mapping[str, Any]) -> dict[str, TopicDurability]:
    """What the broker says of each of ``topics``."""
    replication = await describe_replication(bootstrap, topics, options=options)
    configs = await describe_topic_configs(bootstrap, topics, names=[MIN_INSYNC, UNCLEAN],
                                           options=options)
    found = {}
    for topic in topics:
        config = configs.get(topic, {})
        insync = config.get(MIN_INSYNC)
        unclean = config.get(UNCLEAN)
        found[topic] = TopicDurability(
            replication=replication.get(topic),
            min_insync=int(insync) if insync is not None and insync.isdigit() else None,
            unclean=None if unclean is None else unclean.lower() == "true")
    return found


async def idempotence_finding(bootstrap: str, options: Mapping[str, Any],
                              enabled: bool) -> Finding | None:
    """Whether the relay's ``enable_idempotence`` fits the broker: an idempotent producer is
    started, and the broker's answer compared with the setting (``None``: it fits)."""
    name = "enable_idempotence"
    producer = KafkaProducer(bootstrap, {**options, name: True})
    try:
        await producer.start()
    except IdempotenceRefusedError as exc:
        if enabled or exc.denied:
            return Finding("error", "the relay's idempotent producer: " + exc.advice(
                f"--no-{flag(name)[2:]} or {env_name(name)}=false"))
        return None  # a broker without it, and the relay does without it: as it must
    except StartupError as exc:
        return Finding("unknown", f"the relay's idempotent producer not verified: {exc}")
    finally:
        await producer.stop()
    if enabled:
        return None
    return Finding("warning", (
        f"the relay's idempotent producer is off ({env_name(name)}=false or "
        f"--no-{flag(name)[2:]}) but the broker at {bootstrap} grants it: turn it on; without "
        "it a batch the producer sends again after a lost acknowledgement is written twice"))
