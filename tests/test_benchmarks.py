"""Smoke test of the benchmark suite: one tiny cell (every available peer, 200 messages, paced
latency runs of a few) and a tiny cleanup cell, on the test services. It checks that the harness
runs and reports, not how fast anything is.

Two deliberately broken peers prove the correctness gate can fail: one without dedup (a
duplicate effect per duplicate message) and one that skips some effects (lost effects)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks import markdown, suite
from benchmarks.cleanup import CleanupSpec
from benchmarks.context import Services
from benchmarks.latency import Pace
from benchmarks.lineup import PEERS
from benchmarks.peers import TextbookBatchCommitPeer
from benchmarks.profiles import MAIN, Cell, Profile
from benchmarks.runner import Settings


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


SMOKE = Profile("smoke", (
    Cell(MAIN, "smoke: 200 messages over 10 keys, 10 % duplicates",
         Settings(events=200, keys=10, dup_rate=0.1, runs=1, deadline=60),
         peers=tuple(PEERS), latency=Pace(events=50, rate=100.0, warmup=0.0, deadline=30),
         latency_peers=("raw", "consumerkit", NoDedupPeer.name)),
), CleanupSpec(rows=2_000, pace=Pace(events=100, rate=100.0, warmup=0.0, deadline=30),
               at=0.3, batch=500))


@pytest.mark.slow
async def test_suite_reports_every_peer_and_flags_broken_ones(
    postgres_dsn: str, kafka_bootstrap: str, redis_url: str, tmp_path: Path,
) -> None:
    svc = Services(postgres_dsn, kafka_bootstrap, "test services", "test broker", redis_url,
                   "test redis")
    document = await suite.run_suite(svc, SMOKE, lambda _line: None,
                                     extra=(NoDedupPeer, LossyPeer))

    (cell,) = document["cells"]
    peers: dict[str, dict[str, Any]] = {p["peer"]: p for p in cell["peers"]}
    assert list(peers) == [*PEERS, NoDedupPeer.name, LossyPeer.name]
    for name, peer in peers.items():
        if peer["unavailable"] or name.startswith("broken"):
            continue
        assert peer["exact"], f"{name}: {peer['samples']} {peer['latency']}"
        assert peer["median_msg_per_s"] > 0
        assert peer["ratio_to_textbook"] is not None
        assert set(peer["metrics"]) >= {"commits_per_msg", "wal_syncs_per_msg",
                                        "dedup_bytes_per_million", "cpu_s_per_1000"}
    ranked = [n for n, p in peers.items() if p["exact"]]
    assert {"raw", "textbook", "consumerkit"} <= set(ranked)
    assert peers["consumerkit"]["metrics"]["dedup_bytes_per_million"] > 0
    for name in ("raw", "consumerkit"):
        assert peers[name]["latency"]["p99_ms"] >= peers[name]["latency"]["p50_ms"] > 0

    no_dedup, lossy = peers[NoDedupPeer.name], peers[LossyPeer.name]
    assert not no_dedup["exact"]
    assert no_dedup["median_msg_per_s"] is None
    assert no_dedup["ratio_to_textbook"] is None
    assert "20 duplicate effects" in no_dedup["samples"][0]["detail"]
    assert not lossy["exact"]
    assert "lost effects" in lossy["samples"][0]["detail"]
    assert "0 lost effects" not in lossy["samples"][0]["detail"]

    passes = document["cleanup"]
    assert [p["method"] for p in passes] == ["drop", "delete"]
    assert all(p["exact"] and p["left"] == 0 for p in passes), passes
    assert passes[1]["rows"] == 2_000
    targets, figures = document["acceptance"][:4], document["acceptance"][4:]
    assert all(t["met"] in (True, False, None) for t in targets)
    assert [f["met"] for f in figures] == ["figure"]

    text = markdown.render(document)
    assert "WRONG, not ranked" in text
    assert "### cleanup" in text
    written = suite.write(document, tmp_path)
    assert {p.suffix for p in written} == {".json", ".md", ".png"}
