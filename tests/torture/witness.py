"""A plain aiokafka reader that follows the topic while the run goes on, outside consumerkit.

An event the consumers never applied is lost by them only if a reader could have seen it.
The witness reads every partition from the start, as a streaming consumer does, and keeps
where each record was. After the run, a record of the final read that the witness passed by
without seeing (its partition's position went beyond the record's offset) was kept by the
broker from at least one streaming reader. The report says how many records that was
(``broker_hidden``) and how many of the lost events were among them: a hint of where to look,
never an excuse. The witness's fetches are its own, so what it missed says nothing sure about
what the consumers were sent, and a lost event stays lost."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

log = logging.getLogger("torture")

Position = tuple[int, int]  # (partition, offset)


@dataclass(slots=True)
class Witness:
    bootstrap: str
    topic: str
    partitions: int
    seen: set[Position] = field(default_factory=set)
    passed: dict[int, int] = field(default_factory=dict)  # partition -> next offset to read
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._follow(), name="torture-witness")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def hidden(self, read: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
        """The records of the final read the witness went past without seeing."""
        return [(p, o, i) for p, o, i in read
                if o < self.passed.get(p, 0) and (p, o) not in self.seen]

    async def _follow(self) -> None:
        while True:  # a broker pause can break the reader: it starts again where it was
            # earliest: an answer "out of range" must never move the witness forward, or
            # every record it jumped over would look hidden
            # read_committed, as the consumers read (consumerkit/transport/kafka.py)
            reader = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None,
                                      enable_auto_commit=False, auto_offset_reset="earliest",
                                      isolation_level="read_committed")
            try:
                await reader.start()
                parts = [TopicPartition(self.topic, p) for p in range(self.partitions)]
                reader.assign(parts)
                for tp in parts:
                    reader.seek(tp, self.passed.get(tp.partition, 0))
                while True:
                    batch = await reader.getmany(timeout_ms=500, max_records=2000)
                    for tp, records in batch.items():
                        for r in records:
                            self.seen.add((tp.partition, r.offset))
                        if records:
                            self.passed[tp.partition] = records[-1].offset + 1
            except Exception as exc:  # the witness never ends the run: it starts again
                log.warning("witness reader failed (%r); starting again", exc)
                await asyncio.sleep(1)
            finally:
                with contextlib.suppress(KafkaError, OSError):
                    await reader.stop()
