"""Every peer by name, in the order the reports list them."""

from __future__ import annotations

from .peer_consumerkit import (
    ConsumerkitBatchPeer,
    ConsumerkitBestPeer,
    ConsumerkitDeferPeer,
    ConsumerkitMetricsPeer,
    ConsumerkitPeer,
    ConsumerkitRedisPeer,
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

PEERS: dict[str, type[Peer]] = {p.name: p for p in (
    RawPeer, TextbookPeer, TextbookBatchCommitPeer, TunedPeer, SetBasedPeer, FastStreamPeer,
    ConsumerkitPeer, ConsumerkitRedisPeer, ConsumerkitBestPeer, ConsumerkitMetricsPeer,
    ConsumerkitDeferPeer, ConsumerkitBatchPeer)}

SUITE = ("raw", "textbook", "tuned", "set-based", "faststream", "consumerkit",
         "consumerkit-redis", "consumerkit-best")
"""The peers the issue asks for, in every cell unless the cell names fewer."""

MAIN_PEERS = (*SUITE, "consumerkit-metrics", "consumerkit-defer", "consumerkit-batch")
"""The main cell adds consumerkit with metrics on, to set beside its defaults (metrics off),
and the two faster ways of writing a handler: per message with ``ctx.defer`` (against the
textbook) and per batch, set-based (against the hand-written set-based loop)."""
