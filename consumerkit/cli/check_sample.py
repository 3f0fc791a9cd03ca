"""The event types on a consumer's topics against its handlers: the sampling half of
``consumerkit check MODULE:ATTR``.

The last ``--sample`` records of each partition of each consumed topic are read by a reader
that joins no group and commits nothing (a bounded read: from ``end - N`` to the end, within
``--sample-timeout`` seconds). Then, one line each:

- event types no handler takes: a ``PROBLEM`` when they would be dead-lettered
  (``Unhandled(policy="dead_letter")``), a note when they would be skipped;
- a handler whose event type never appears in the sample: a ``PROBLEM`` when the sample holds
  an unhandled type it is close to (``order.craeted`` beside ``order.created``: a misspelt
  handler, every one of whose events is dead-lettered or skipped), else a ``WARNING`` (a rare
  event type, or one not produced yet, looks the same).
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from ..engine.unhandled import NEAR
from ..envelope import RecordLike
from ..transport.kafka import consumer_options
from .common import count

if TYPE_CHECKING:
    from ..consumer import Consumer

DEFAULT_SAMPLE = 100  # records per partition
DEFAULT_TIMEOUT = 15.0  # seconds the whole read may take
_SHOWN = 10  # event types named in one line


class Findings(Protocol):
    def ok(self, text: str) -> None: ...

    def note(self, text: str) -> None: ...

    def warn(self, text: str) -> None: ...

    def problem(self, text: str) -> None: ...


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sample", type=count, default=DEFAULT_SAMPLE, metavar="N",
                        help="with MODULE:ATTR, read the last N records of each partition of "
                        "its topics and compare their event types with its handlers (0: do "
                        f"not sample; default: {DEFAULT_SAMPLE})")
    parser.add_argument("--sample-timeout", type=float, default=DEFAULT_TIMEOUT,
                        metavar="SECONDS", help="the longest the sample may take to read "
                        f"(default: {DEFAULT_TIMEOUT:g})")


async def check_sample(consumer: Consumer, per_partition: int, timeout: float,
                       report: Findings) -> None:
    """Read the sample of ``consumer``'s topics and report what its handlers miss."""
    if per_partition == 0 or consumer.kafka_bootstrap is None:
        return
    try:
        records = await read_recent(consumer.kafka_bootstrap, consumer.topics,
                                    consumer.kafka_consumer_options, per_partition, timeout)
    except KafkaError as exc:
        report.problem(f"cannot sample the consumed topics: {exc}")
        return
    judge_sample(consumer, records, per_partition, report)


def judge_sample(consumer: Consumer, records: Mapping[str, Sequence[RecordLike]],
                 per_partition: int, report: Findings) -> None:
    """The findings of a sample (``records`` by topic)."""
    decoder = consumer.decoder()
    routes = consumer.routes
    seen: Counter[str] = Counter()
    unrouted_seen: set[str] = set()
    for topic, sample in records.items():
        if not sample:
            report.note(f"topic {topic}: no record to sample")
            continue
        types = Counter(t for t in map(decoder.event_type, sample) if t is not None)
        seen.update(types)
        unrouted = sorted(t for t in types if routes.find(t, topic) is None)
        unrouted_seen.update(unrouted)
        fates = {t: decoder.types.fate(t) for t in unrouted}
        lost = [t for t in unrouted if fates[t] == "dead_letter"]
        skipped = [t for t in unrouted if fates[t] == "skip"]
        what = f"topic {topic} (last {per_partition} per partition, {len(sample)} records)"
        if lost:
            report.problem(f"{what}: event types no handler takes, dead-lettered: "
                           f"{_named(lost, types)}; handle them, or skip them with "
                           "Unhandled(policy='skip') or Unhandled(ignore=[...]) "
                           "(--unhandled-policy, --unhandled-ignore)")
        if skipped:
            report.note(f"{what}: event types no handler takes, skipped: "
                        f"{_named(skipped, types)}")
        if not unrouted:
            report.ok(f"{what}: every event type has a handler")
    if not seen:
        return
    for event_type in sorted(set(routes.by_type) - set(seen)):
        close = difflib.get_close_matches(event_type, sorted(unrouted_seen), n=1, cutoff=NEAR)
        if close:
            report.problem(f"handler {routes.by_type[event_type].name} takes event type "
                           f"{event_type!r}, never seen in the sample, but {close[0]!r} is "
                           f"({_records(seen[close[0]])}, no handler): misspelt?")
        else:
            report.warn(f"handler {routes.by_type[event_type].name} takes event type "
                        f"{event_type!r}, never seen in the sample (rare, not produced yet, "
                        "or misspelt?)")


def _records(n: int) -> str:
    return f"{n} record{'' if n == 1 else 's'}"


def _named(types: Sequence[str], counts: Counter[str]) -> str:
    shown = ", ".join(f"{t} ({counts[t]})" for t in types[:_SHOWN])
    return shown + (f" and {len(types) - _SHOWN} more" if len(types) > _SHOWN else "")


async def read_recent(bootstrap: str, topics: Sequence[str], options: Mapping[str, Any],
                      per_partition: int, timeout: float) -> dict[str, list[RecordLike]]:
    """The last ``per_partition`` records of each partition of ``topics`` (a topic missing
    on the broker: none), read without a group and without committing."""
    settings = {k: v for k, v in consumer_options(options).items()
                if k not in ("rebalance_timeout_ms", "auto_offset_reset")}
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, **settings)
    found: dict[str, list[RecordLike]] = {topic: [] for topic in topics}
    await reader.start()
    try:
        # One all-topics metadata request: the reader's own metadata holds only the topics it
        # has asked about (on Apache Kafka, none yet), so partitions_for_topic() is empty.
        cluster = await reader._client.fetch_all_metadata()
        parts = [TopicPartition(t, p) for t in topics
                 for p in sorted(cluster.partitions_for_topic(t) or ())]
        if not parts:
            return found
        begin = await reader.beginning_offsets(parts)
        end = await reader.end_offsets(parts)
        wanted = [tp for tp in parts if end[tp] > begin[tp]]
        kept: dict[TopicPartition, deque[RecordLike]] = {
            tp: deque(maxlen=per_partition) for tp in wanted}
        reader.assign(wanted)
        for tp in wanted:
            reader.seek(tp, max(begin[tp], end[tp] - per_partition))
        await _read(reader, kept, end, time.monotonic() + timeout)
        for tp, records in kept.items():
            found[tp.topic].extend(records)
    finally:
        await reader.stop()
    return found


async def _read(reader: AIOKafkaConsumer, kept: dict[TopicPartition, deque[RecordLike]],
                end: Mapping[TopicPartition, int], deadline: float) -> None:
    """Fetch until every partition reached its end offset and one more fetch found nothing
    new (a broker may count the end from its newest batch's first record), or the deadline."""
    reached = False
    while kept and (left := deadline - time.monotonic()) > 0:
        fetched = await asyncio.wait_for(
            reader.getmany(timeout_ms=int(min(left, 0.5) * 1000)), left + 5)
        for tp, records in fetched.items():
            kept[tp].extend(records)
        if reached and not fetched:
            return
        reached = reached or all(await _positions(reader, end))


async def _positions(reader: AIOKafkaConsumer, end: Mapping[TopicPartition, int],
                     ) -> list[bool]:
    return [await reader.position(tp) >= offset for tp, offset in end.items()
            if tp in reader.assignment()]
