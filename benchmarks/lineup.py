"""Every peer by name, in the order the reports list them."""

from __future__ import annotations

from .peer_before import ConsumerkitBeforePeer
from .peer_consumerkit import (
    ConsumerkitBatchPeer,
    ConsumerkitBestPeer,
    ConsumerkitDeferPeer,
    ConsumerkitMetricsPeer,
    ConsumerkitPeer,
    ConsumerkitPostgresOffsetsPeer,
    ConsumerkitRedisPeer,
    SetBasedClaimPeer,
)
from .peer_faststream import FastStreamPeer
from .peers import (
    Peer,
    RawPeer,
    SetBasedPeer,
    TextbookBatchCommitPeer,
    TextbookPeer,
    TunedPeer,
)
from .peers_partitioned import SetBasedEventDayPeer, SetBasedPartitionedPeer

PEERS: dict[str, type[Peer]] = {p.name: p for p in (
    RawPeer, TextbookPeer, TextbookBatchCommitPeer, TunedPeer, SetBasedPeer,
    SetBasedPartitionedPeer, FastStreamPeer,
    ConsumerkitPeer, ConsumerkitRedisPeer, ConsumerkitBestPeer, ConsumerkitMetricsPeer,
    ConsumerkitDeferPeer, ConsumerkitBatchPeer, SetBasedClaimPeer, ConsumerkitBeforePeer,
    SetBasedEventDayPeer, ConsumerkitPostgresOffsetsPeer)}

SUITE = ("raw", "textbook", "tuned", "set-based", "faststream", "consumerkit",
         "consumerkit-redis", "consumerkit-best")
"""The peers the issue asks for, in every cell unless the cell names fewer."""

MAIN_PEERS = (*SUITE, "consumerkit-metrics", "consumerkit-defer", "consumerkit-batch",
              "set-based-partitioned", "set-based-claim", "set-based-event-day",
              "consumerkit-before", "consumerkit-pg-offsets")
"""The main cell adds consumerkit with metrics on, to set beside its defaults (metrics off),
and the two faster ways of writing a handler: per message with ``ctx.defer`` (against the
textbook) and per batch, set-based (against the hand-written set-based loop); and that loop
on a table partitioned by day and on consumerkit's dedup table, which split the batch
handler's gap to it: the partitions' share, the claim's, the engine's; the loop on a table
partitioned by the event's own day, which has a unique key but a weaker guarantee (what the
partitions' share would be without it); and consumerkit's defaults as they were before batch
handlers and ``ctx.defer`` (``peer_before``), which its defaults today must not be slower
than; and consumerkit's defaults with the offsets stored in the effects' transactions
(``offset_store="postgres"``), to set beside them: what keeping the offsets in the database
costs."""
