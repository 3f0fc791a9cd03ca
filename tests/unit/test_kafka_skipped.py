"""The ranges aiokafka's fetcher drops (transaction markers, aborted transactions' batches),
as :mod:`consumerkit.transport.kafka_skipped` notes them, on aiokafka's own unpacking of a
fetch response built batch by batch as a broker writes it.

These tests reach the aiokafka internals the watch relies on (``PartitionRecords``,
``FetchResult``, the record builder). When an aiokafka release changes them, they fail here,
loudly, rather than the consumer quietly reading every marker's gap again."""

from __future__ import annotations

import struct
from collections import OrderedDict
from typing import Any

from aiokafka.consumer.fetcher import READ_COMMITTED, FetchResult, PartitionRecords
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.record.util import calc_crc32c
from aiokafka.structs import TopicPartition

from consumerkit.transport.kafka_skipped import SkipWatch

TP = TopicPartition("t", 0)
ATTRIBUTES, CRC, CONTROL = 21, 17, 0x20  # the v2 batch header's layout (KIP-98)
COMMIT, ABORT = 1, 0


def batch(base: int, count: int, producer: int = -1, control: int | None = None) -> bytes:
    """A record batch as the broker stores it: ``count`` records from offset ``base``, of
    ``producer``'s transaction if given; with ``control``, its marker (commit or abort)."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=int(producer >= 0),
        producer_id=producer, producer_epoch=0 if producer >= 0 else -1,
        base_sequence=0 if producer >= 0 else -1, batch_size=1 << 20)
    for delta in range(count):
        if control is None:
            builder.append(delta, timestamp=0, key=b"k", value=f"v{base + delta}".encode(),
                           headers=[])
        else:
            builder.append(delta, timestamp=0, key=struct.pack(">hh", 0, control),
                           value=struct.pack(">hi", 0, 0), headers=[])
    buf = bytearray(builder.build())
    struct.pack_into(">q", buf, 0, base)  # the broker sets the base offset
    if control is not None:  # and only the broker writes control batches
        attributes = struct.unpack_from(">h", buf, ATTRIBUTES)[0] | CONTROL
        struct.pack_into(">h", buf, ATTRIBUTES, attributes)
        struct.pack_into(">I", buf, CRC, calc_crc32c(bytes(buf[ATTRIBUTES:])))
    return bytes(buf)


class Fetcher:
    """Where aiokafka's fetcher stores a partition's fetch result (``_records``)."""

    def __init__(self) -> None:
        self._records: OrderedDict[TopicPartition, Any] = OrderedDict()


class Assignment:
    """A partition's assignment, as a ``FetchResult`` asks it (active, not paused)."""

    active = True

    def __init__(self, position: int) -> None:
        self.state = type("State", (), {"paused": False, "position": position,
                                        "consumed_to": self._consumed_to})()

    def _consumed_to(self, offset: int) -> None:
        self.state.position = offset

    def state_value(self, tp: TopicPartition) -> Any:
        return self.state


def unpack(log: list[bytes], aborted: list[tuple[int, int]], fetch_offset: int,
           max_records: int | None = None) -> tuple[list[int], SkipWatch, FetchResult]:
    """Store a fetch response as aiokafka's fetcher does, through a watched fetcher, and take
    its records as ``getmany`` does; the offsets taken, the watch and the result."""
    consumer = type("Consumer", (), {})()
    consumer._fetcher = Fetcher()
    watch = SkipWatch()
    assert watch.watch(consumer)
    records = PartitionRecords(TP, MemoryRecords(b"".join(log)), aborted, fetch_offset,
                               None, None, True, READ_COMMITTED)
    assignment = Assignment(fetch_offset)
    result = FetchResult(TP, assignment=assignment, partition_records=records, backoff=0)
    consumer._fetcher._records[TP] = result
    taken = [r.offset for r in result.getall(max_records)]
    return taken, watch, result


def test_markers_and_aborted_batches_are_noted_and_records_are_not() -> None:
    log = [
        batch(0, 3),                        # 0-2 plain records
        batch(3, 2, producer=7),            # 3-4 committed by 5
        batch(5, 1, producer=7, control=COMMIT),
        batch(6, 2, producer=8),            # 6-7 aborted by 9
        batch(8, 1, producer=7),            # 8 committed by 10, between the aborted ones
        batch(9, 1, producer=8, control=ABORT),
        batch(10, 1, producer=7, control=COMMIT),
        batch(11, 2),                       # 11-12
    ]
    taken, watch, _ = unpack(log, aborted=[(8, 6)], fetch_offset=0)
    assert taken == [0, 1, 2, 3, 4, 8, 11, 12]
    assert watch.take() == {("t", 0): [(5, 8), (9, 11)]}
    assert watch.take() == {}  # handed out once


def test_a_fetch_cut_short_notes_only_what_aiokafka_moved_past() -> None:
    log = [batch(0, 2, producer=7), batch(2, 1, producer=7, control=COMMIT),
           batch(3, 2, producer=7), batch(5, 1, producer=7, control=COMMIT)]
    taken, watch, result = unpack(log, aborted=[], fetch_offset=0, max_records=2)
    assert taken == [0, 1]
    assert watch.take() == {}  # the marker at 2 is not reached yet
    assert [r.offset for r in result.getall(2)] == [3, 4]
    assert watch.take() == {("t", 0): [(2, 3)]}
    assert result.getall(2) == []
    assert watch.take() == {("t", 0): [(5, 6)]}


def test_a_log_without_transactions_notes_nothing() -> None:
    taken, watch, _ = unpack([batch(0, 2), batch(2, 3)], aborted=[], fetch_offset=1)
    assert taken == [1, 2, 3, 4]
    assert watch.take() == {}


def test_the_watch_refuses_a_fetcher_it_does_not_know() -> None:
    consumer = type("Consumer", (), {})()
    consumer._fetcher = type("Fetcher", (), {"_records": {}})()
    assert not SkipWatch().watch(consumer)
    consumer._fetcher = None
    assert not SkipWatch().watch(consumer)

