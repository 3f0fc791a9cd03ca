"""Smoke test of the throughput harness: tiny workload, every peer once, on the test services.

Two deliberately broken peers prove the correctness gate can fail: one without dedup (a
duplicate effect per duplicate message) and one that skips some effects (lost effects)."""

from __future__ import annotations

from benchmarks.lineup import PEERS
from benchmarks.peers import Peer, TextbookBatchCommitPeer
from benchmarks.runner import Settings, benchmark


class NoDedupPeer(TextbookBatchCommitPeer):
    name = "broken-no-dedup"
    description = "applies every delivery: duplicates become duplicate effects"

    async def claim(self, event_id: str) -> bool:
        return True


class LossyPeer(TextbookBatchCommitPeer):
    name = "broken-lossy"
    description = "acknowledges every message but skips the effect of ids ending in 3"

    async def claim(self, event_id: str) -> bool:
        return await super().claim(event_id) and not event_id.endswith("3")


async def test_every_peer_is_exact_and_broken_peers_are_caught(
    postgres_dsn: str, kafka_bootstrap: str,
) -> None:
    settings = Settings(events=200, keys=10, dup_rate=0.1, runs=1, deadline=60)
    peers: list[type[Peer]] = [*PEERS.values(), NoDedupPeer, LossyPeer]
    summaries = {s.peer: s for s in await benchmark(
        postgres_dsn, kafka_bootstrap, settings, peers)}

    for name in PEERS:
        summary = summaries[name]
        assert summary.exact, f"{name}: {summary.problems()}"
        assert summary.median > 0, name
    assert not summaries[NoDedupPeer.name].exact
    assert "20 duplicate effects" in summaries[NoDedupPeer.name].problems()
    assert not summaries[LossyPeer.name].exact
    assert "lost effects" in summaries[LossyPeer.name].problems()
    assert "0 lost effects" not in summaries[LossyPeer.name].problems()
