"""Which offsets aiokafka's fetcher passed over for a reason the broker gave: control batches
(transaction markers) and, under ``read_committed``, the batches of aborted transactions.

aiokafka drops those batches as it unpacks a fetch response (``PartitionRecords`` in
``aiokafka/consumer/fetcher.py``) and says nothing of it, yet the engine must tell such a gap
from records a broker hid (:mod:`consumerkit.offsets.sighting`). Every record batch aiokafka
hands out to a caller it iterates (``for record in batch``); the two batches it drops it never
iterates. So :class:`SkipWatch` wraps the record set of each fetched partition, and a batch
that aiokafka moved past without iterating was dropped whole: its offsets hold nothing for
this reader. A batch whose unpacking was cut short (the fetch discarded after a seek) is
noted only once aiokafka has moved past it, so nothing is noted that a later read could still
return.

This is the only module that reaches into aiokafka's private fetcher: the consumer's
``_fetcher._records`` (where a fetch's ``FetchResult`` lands), a result's
``_partition_records`` and that one's ``_records`` (read when unpacking begins, so it can be
wrapped before). If they change, :meth:`SkipWatch.watch` finds them missing and says so: every
gap is read again, as without it (slower, never wrong), and
``tests/unit/test_kafka_skipped.py`` fails.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

from .source import Partition

log = logging.getLogger("consumerkit.consumer")


class SkipWatch:
    """The ranges ``[first, end)`` the fetcher of one consumer dropped, per partition, until
    :meth:`take` hands them out."""

    __slots__ = ("_ranges",)

    def __init__(self) -> None:
        self._ranges: dict[Partition, list[tuple[int, int]]] = {}

    def watch(self, consumer: Any) -> bool:
        """Watch ``consumer``'s fetcher (an ``AIOKafkaConsumer``, started, before its first
        fetch). False, logged once, when aiokafka's internals are not as expected."""
        fetcher = getattr(consumer, "_fetcher", None)
        results = getattr(fetcher, "_records", None)
        if type(results) is not OrderedDict:
            log.warning("this aiokafka's fetcher is not the one consumerkit knows: transaction "
                        "markers cannot be told from hidden records, and each gap they leave "
                        "is read again")
            return False
        fetcher._records = _Results(results, self)  # type: ignore[union-attr]
        return True

    def wrap(self, result: Any) -> None:
        """Wrap the record set of a fetch result (a ``FetchResult``) aiokafka just stored."""
        unpacking: Any = getattr(result, "_partition_records", None)
        records = getattr(unpacking, "_records", None)
        tp = getattr(result, "_topic_partition", None)
        if records is None or tp is None:
            return  # an error kept for the caller, or an aiokafka that changed: nothing noted
        unpacking._records = _Batches(records, self, (tp.topic, tp.partition))

    def note(self, part: Partition, first: int, end: int) -> None:
        ranges = self._ranges.setdefault(part, [])
        if ranges and ranges[-1][1] == first:
            ranges[-1] = (ranges[-1][0], end)  # batches follow each other: one range
        else:
            ranges.append((first, end))

    def take(self) -> dict[Partition, list[tuple[int, int]]]:
        """The ranges noted since the last call."""
        taken, self._ranges = self._ranges, {}
        return taken


class _Results(OrderedDict[Any, Any]):
    """The fetcher's results by partition: each ``FetchResult`` wrapped as it is stored."""

    def __init__(self, results: OrderedDict[Any, Any], watch: SkipWatch) -> None:
        super().__init__(results)
        self.watch = watch

    def __setitem__(self, key: Any, value: Any) -> None:
        self.watch.wrap(value)
        super().__setitem__(key, value)


class _Batches:
    """A fetch's record set (``MemoryRecords``), noting each batch aiokafka moved past without
    iterating it."""

    __slots__ = ("_current", "_part", "_records", "_watch")

    def __init__(self, records: Any, watch: SkipWatch, part: Partition) -> None:
        self._records = records
        self._watch = watch
        self._part = part
        self._current: _Batch | None = None

    def _moved_on(self) -> None:
        batch, self._current = self._current, None
        if batch is not None and not batch.iterated:
            self._watch.note(self._part, batch.base_offset, batch.next_offset)

    def has_next(self) -> bool:
        self._moved_on()  # asked only once the batch before is done with
        return bool(self._records.has_next())

    def next_batch(self) -> Any:
        self._moved_on()
        batch = self._records.next_batch()
        if batch is None or not (hasattr(batch, "base_offset")
                                 and hasattr(batch, "next_offset")):
            return batch
        self._current = _Batch(batch)
        return self._current

    def __getattr__(self, name: str) -> Any:
        return getattr(self._records, name)


class _Batch:
    """A record batch that remembers whether its records were iterated."""

    __slots__ = ("_batch", "iterated")

    def __init__(self, batch: Any) -> None:
        self._batch = batch
        self.iterated = False

    def __iter__(self) -> Any:
        self.iterated = True
        return iter(self._batch)

    def __next__(self) -> Any:  # the control record's key, read to tell an abort marker
        return next(self._batch)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batch, name)
