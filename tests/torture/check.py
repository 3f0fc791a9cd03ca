"""The checker: what went in (committed business events) against what came out (the effects
ledger, the dead letters, the topic), as counts. Pure: it reads a :class:`History` and needs no
service, so hand-made bad histories test it (``tests/torture/test_check.py``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Produced:
    aggregate: str
    seq: int  # 0 for poison events, which belong to no sequence
    poison: bool = False


@dataclass(slots=True)
class History:
    """Everything the check needs, read after the drain."""

    committed: dict[str, Produced]  # event id -> what the producer committed
    effects: list[tuple[str, str, int]]  # (event id, aggregate, seq) in the order applied
    dead_letters: list[tuple[str | None, str]]  # (event id, reason)
    published: list[str]  # event id of every record read from the topic at the end
    republished: int = 0  # copies the harness itself put on the topic again
    raw_poison: set[str] = field(default_factory=set)  # malformed records sent to the topic
    projection_violations: int = 0  # counted by the handler, in its transaction
    parked: list[tuple[str | None, str]] = field(default_factory=list)
    # records of aborted Kafka transactions (txn_producer_proc.py): never to be applied
    aborted: set[str] = field(default_factory=set)
    # events whose every copy on the topic the broker kept from the witness, a streaming
    # reader (see witness.py): where to look first when one of them is lost, never an excuse
    broker_hidden: set[str] = field(default_factory=set)
    # the projection's violations as (aggregate, seq received), and the failovers of the run
    violations: list[tuple[str, int]] = field(default_factory=list)
    failovers: int = 0


@dataclass(frozen=True, slots=True)
class Findings:
    events_committed: int
    poison_committed: int
    deliveries_total: int
    deliveries_distinct: int
    relay_duplicates: int
    unpublished: int
    effects: int
    duplicate_effects: int
    lost: int
    lost_hidden: int  # of the lost, those the broker also kept from the witness
    phantom: int
    order_violations: int
    projection_violations: int
    dead_lettered: dict[str, int]
    unexpected_dead_letters: int
    aborted_applied: int  # effects of aborted transactions' records (phantoms of their own)
    parked: dict[str, int]
    examples: dict[str, list[str]]
    lost_ids: list[str]  # all of them: where each was on the topic tells whose commit passed it
    # after a failover to a standby that missed commits: events the relay published from rows
    # the failover took back (on the topic, no source row), their effects, and the projection
    # violations they explain (the producers' sequence numbers, rolled back, are used again)
    orphans: int = 0
    orphan_effects: int = 0
    orphan_violations: int = 0

    @property
    def verdict(self) -> bool:
        return not (self.duplicate_effects or self.lost or self.phantom or self.order_violations
                    or self.projection_violations or self.aborted_applied)


def _orphans(h: History) -> set[str]:
    """Events on the topic with no source row: after a failover, those the relay published
    from transactions the promoted standby lacks. Without a failover there are none: such an
    event is a phantom (the relay published what was never committed)."""
    if not h.failovers:
        return set()
    return {e for e in h.published if e not in h.committed and e not in h.raw_poison}


def check(h: History) -> Findings:
    orphans = _orphans(h)
    orphan_seqs = {(a, s) for e, a, s in h.effects if e in orphans}
    explained_violations = sum((a, got) in orphan_seqs for a, got in h.violations)
    applied = Counter(event_id for event_id, _, _ in h.effects)
    lettered = {event_id for event_id, _ in h.dead_letters if event_id is not None}
    explained = lettered | {event_id for event_id, _ in h.parked if event_id is not None}
    lost = sorted(e for e in h.committed if e not in applied and e not in explained)
    hidden = [e for e in lost if e in h.broker_hidden]
    phantom = sorted(e for e in applied if e not in orphans and (
        e not in h.committed or h.committed[e].poison))
    duplicates = sorted(e for e, n in applied.items() if n > 1)
    unexpected = sorted(e for e in lettered
                        if e in h.committed and not h.committed[e].poison)
    order = _order_violations(h, explained, orphans)
    published = Counter(h.published)
    extra_copies = sum(n - 1 for n in published.values())
    return Findings(
        events_committed=sum(not p.poison for p in h.committed.values()),
        poison_committed=sum(p.poison for p in h.committed.values()),
        deliveries_total=len(h.published),
        deliveries_distinct=len(published),
        relay_duplicates=max(0, extra_copies - h.republished),
        unpublished=sum(e not in published for e in h.committed),
        effects=len(h.effects),
        duplicate_effects=sum(applied[e] - 1 for e in duplicates),
        lost=len(lost),
        lost_hidden=len(hidden),
        phantom=len(phantom),
        order_violations=len(order),
        projection_violations=h.projection_violations - explained_violations,
        dead_lettered=dict(Counter(reason for _, reason in h.dead_letters)),
        unexpected_dead_letters=len(unexpected),
        aborted_applied=sum(n for e, n in applied.items() if e in h.aborted),
        parked=dict(Counter(reason for _, reason in h.parked)),
        examples={name: ids[:5] for name, ids in (
            ("lost", lost), ("lost_hidden", hidden), ("phantom", phantom),
            ("duplicate", duplicates), ("order", order),
            ("unexpected_dead_letter", unexpected)) if ids},
        lost_ids=lost,
        orphans=len(orphans),
        orphan_effects=sum(applied[e] for e in orphans),
        orphan_violations=explained_violations,
    )


def _order_violations(h: History, explained: set[str],
                      orphans: Collection[str] = ()) -> list[str]:
    """Effects applied out of their aggregate's sequence: each aggregate's first effects, in
    the order applied, must go 1, 2, 3, ... skipping only events explained by a dead letter
    or a parked entry. Repeated effects are duplicates, counted apart, not here.

    An orphan holds its place in the sequence when a committed event of its aggregate comes
    after it and none took its number again: a producer that numbers in memory (the
    transactional one) went on past it, where the outbox's producer, whose counter the
    failover took back, numbers its next events the same as the orphans."""
    skipped: dict[str, set[int]] = {}
    for event_id in explained:
        produced = h.committed.get(event_id)
        if produced is not None and not produced.poison:
            skipped.setdefault(produced.aggregate, set()).add(produced.seq)
    taken = {(p.aggregate, p.seq) for p in h.committed.values() if not p.poison}
    top: dict[str, int] = {}
    for aggregate, seq in taken:
        top[aggregate] = max(seq, top.get(aggregate, 0))
    last: dict[str, int] = {}
    seen: set[str] = set()
    wrong: list[str] = []
    for event_id, aggregate, seq in h.effects:
        if event_id in seen:
            continue
        if event_id in orphans:
            if (aggregate, seq) in taken or seq > top.get(aggregate, 0):
                continue
        elif event_id not in h.committed or h.committed[event_id].poison:
            continue
        seen.add(event_id)
        expected = last.get(aggregate, 0) + 1
        while expected in skipped.get(aggregate, ()):
            expected += 1
        if seq != expected:
            wrong.append(event_id)
        last[aggregate] = max(seq, last.get(aggregate, 0))
    return wrong


def transactions(h: History, sent: dict[str, tuple[str, int, str]],
                 visible: set[str]) -> dict[str, int]:
    """Add what transactional producers sent to ``h``: ``sent`` is event id -> (aggregate,
    seq, outcome the producer recorded), ``visible`` the ids a read_committed read of the
    topic found. Committed records are in ``business`` already; aborted ones must never be
    applied; one whose commit's outcome is unknown (or never recorded) is committed if a
    read_committed reader sees it, aborted if not. Returns the records by outcome."""
    outcomes: Counter[str] = Counter()
    for event_id, (aggregate, seq, outcome) in sent.items():
        if outcome in ("unknown", "open"):
            decided = "committed" if event_id in visible else "aborted"
            outcome = f"{outcome}_{decided}"
            if decided == "committed":
                h.committed.setdefault(event_id, Produced(aggregate, seq))
        if outcome.endswith("aborted"):
            h.aborted.add(event_id)
        outcomes[outcome] += 1
    return dict(sorted(outcomes.items()))
