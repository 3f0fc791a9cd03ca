"""FastStream with a hand-written dedup: what a typical user writes instead of consumerkit.

A ``@broker.subscriber`` with ``ack_policy=AckPolicy.MANUAL`` (FastStream's default,
``ACK_FIRST``, turns aiokafka's auto-commit on and commits before the handler runs). The
handler takes a connection from an asyncpg pool, runs ``INSERT INTO processed ... ON CONFLICT
DO NOTHING`` and, if the row was new, the effect, in one transaction, then ``await msg.ack()``:
FastStream commits the consumer's position (``AIOKafkaConsumer.commit()`` without offsets)
once per message. FastStream reads with ``getone()`` and handles one message at a time.
"""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any

import asyncpg

from .effects import dedup_sql
from .peers import FAST_GROUP, POLL_RECORDS, Peer, PeerEnv
from .workload import ID_HEADER, Amount


class FastStreamPeer(Peer):
    name = "faststream"
    description = ("FastStream subscriber, manual ack: per message a pooled connection, "
                   "BEGIN; INSERT dedup ON CONFLICT DO NOTHING; effect; COMMIT; msg.ack()")

    @classmethod
    def unavailable(cls, redis_url: str | None) -> str | None:
        if importlib.util.find_spec("faststream") is None:
            return "faststream is not installed (pip install 'consumerkit[bench]')"
        return None

    def __init__(self, env: PeerEnv) -> None:
        super().__init__(env)
        self.subscriber: Any = None

    def ready(self) -> bool:
        consumer = getattr(self.subscriber, "consumer", None)
        return consumer is not None and bool(consumer.assignment())

    async def run(self) -> None:
        from faststream.kafka import KafkaBroker, KafkaMessage
        from faststream.middlewares import AckPolicy

        pool = await asyncpg.create_pool(self.env.dsn, min_size=1, max_size=4)
        broker = KafkaBroker(self.env.bootstrap, logger=None)
        dedup, effect = dedup_sql(self.env.schema), self.env.effect

        async def handle(body: Amount, msg: KafkaMessage) -> None:
            self.arrived()
            async with pool.acquire() as conn, conn.transaction():
                if await conn.execute(dedup, msg.headers[ID_HEADER]) == "INSERT 0 1":
                    await effect.apply(conn, body.key, body.amount)
            await msg.ack()
            self.finished()

        self.subscriber = broker.subscriber(
            self.env.topic, group_id=self.env.group, auto_offset_reset="earliest",
            ack_policy=AckPolicy.MANUAL, isolation_level="read_committed",
            max_poll_records=POLL_RECORDS, session_timeout_ms=FAST_GROUP["session_timeout_ms"],
            heartbeat_interval_ms=FAST_GROUP["heartbeat_interval_ms"],
            rebalance_timeout_ms=FAST_GROUP["rebalance_timeout_ms"],
            fetch_max_wait_ms=FAST_GROUP["fetch_max_wait_ms"])
        self.subscriber(handle)
        try:
            await broker.start()
            try:
                await self.stop.wait()
            finally:
                await broker.stop()
        finally:
            await asyncio.wait_for(pool.close(), 30)
