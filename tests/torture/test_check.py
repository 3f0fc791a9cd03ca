"""The torture checker catches hand-made bad histories, and passes a clean one; the fault
schedule and the fail-point module behave as the harness relies on."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

from .check import History, Produced, check, transactions
from .faults import KINDS, schedule
from .procs import ROOT


def clean() -> History:
    """Two aggregates, three events each, applied once in order; one poison event
    dead-lettered; a relay duplicate and a re-published copy on the topic."""
    committed = {f"{a}{s}": Produced(a, s) for a in "ab" for s in (1, 2, 3)}
    committed["p"] = Produced("poison-1", 0, poison=True)
    effects = [(f"{a}{s}", a, s) for s in (1, 2, 3) for a in "ab"]
    return History(committed=committed, effects=effects,
                   dead_letters=[("p", "handler_failed"), ("raw-1", "invalid_json")],
                   published=[*committed, "a1", "b2", "raw-1"], republished=1,
                   raw_poison={"raw-1"})


def test_a_clean_history_passes_with_every_figure_counted() -> None:
    found = check(clean())
    assert found.verdict
    assert (found.events_committed, found.poison_committed) == (6, 1)
    assert (found.deliveries_total, found.deliveries_distinct) == (10, 8)
    assert found.relay_duplicates == 1  # two extra copies, one of them re-published on purpose
    assert found.dead_lettered == {"handler_failed": 1, "invalid_json": 1}
    assert found.unexpected_dead_letters == 0
    assert found.unpublished == 0


def test_an_applied_record_of_an_aborted_transaction_fails_the_verdict() -> None:
    """Records of Kafka transactions: t1 committed (in business), t2 aborted, t3 and t4 of a
    commit whose outcome is unknown, decided by what a read_committed reader saw (t3 yes)."""
    h = clean()
    h.committed["t1"] = Produced("tx-0-0-1", 1)
    h.effects.append(("t1", "tx-0-0-1", 1))
    sent = {"t1": ("tx-0-0-1", 1, "committed"), "t2": ("txa-0-1", 1, "aborted"),
            "t3": ("tx-0-0-2", 1, "unknown"), "t4": ("tx-0-0-3", 1, "open")}
    outcomes = transactions(h, sent, visible={"t1", "t3"})
    assert outcomes == {"aborted": 1, "committed": 1, "open_aborted": 1,
                        "unknown_committed": 1}
    assert h.aborted == {"t2", "t4"}
    assert h.committed["t3"] == Produced("tx-0-0-2", 1)
    found = check(h)
    assert (found.lost, found.lost_ids) == (1, ["t3"])  # seen committed, never applied
    h.effects.append(("t3", "tx-0-0-2", 1))
    assert check(h).verdict
    h.effects.append(("t2", "txa-0-1", 1))  # what a read_uncommitted consumer would do
    found = check(h)
    assert (found.aborted_applied, found.phantom) == (1, 1)
    assert not found.verdict


def test_a_duplicate_effect_is_counted_and_fails() -> None:
    h = clean()
    h.effects.append(("a2", "a", 2))
    found = check(h)
    assert (found.duplicate_effects, found.order_violations) == (1, 0)
    assert found.examples["duplicate"] == ["a2"]
    assert not found.verdict


def test_a_gap_is_a_lost_event_unless_a_dead_letter_explains_it() -> None:
    h = clean()
    h.effects.remove(("b2", "b", 2))
    found = check(h)
    assert found.lost == 1
    assert found.order_violations == 1  # b3 came after b1
    assert not found.verdict
    h.dead_letters.append(("b2", "handler_failed"))
    explained = check(h)
    assert (explained.lost, explained.order_violations) == (0, 0)
    assert explained.unexpected_dead_letters == 1  # reported, a sound event was given up
    assert explained.verdict


def test_an_event_the_broker_hid_from_the_witness_is_still_lost() -> None:
    """b2 is on the topic (the final read found it), but the witness, reading as a consumer
    does, went past its offset without seeing it: a hint for the report, not an excuse."""
    h = clean()
    h.effects.remove(("b2", "b", 2))
    h.broker_hidden = {"b2"}
    found = check(h)
    assert (found.lost, found.lost_hidden) == (1, 1)
    assert found.examples["lost_hidden"] == ["b2"]
    assert not found.verdict


def test_a_reorder_within_an_aggregate_fails() -> None:
    h = clean()
    i, j = h.effects.index(("a2", "a", 2)), h.effects.index(("a3", "a", 3))
    h.effects[i], h.effects[j] = h.effects[j], h.effects[i]
    found = check(h)
    assert found.order_violations == 2
    assert (found.lost, found.duplicate_effects) == (0, 0)
    assert not found.verdict


def test_a_phantom_effect_fails_a_rolled_back_event_and_an_applied_poison_alike() -> None:
    h = clean()
    h.effects.append(("rolled-back", "a", 4))
    assert check(h).phantom == 1
    h = clean()
    h.effects.append(("p", "poison-1", 0))
    h.dead_letters.remove(("p", "handler_failed"))
    found = check(h)
    assert (found.phantom, found.lost) == (1, 0)
    assert not found.verdict


def test_a_violation_seen_only_by_the_projection_fails() -> None:
    h = clean()
    h.projection_violations = 1
    assert not check(h).verdict


def test_an_event_never_published_is_lost_and_unpublished() -> None:
    h = clean()
    h.published.remove("b3")
    h.effects.remove(("b3", "b", 3))
    found = check(h)
    assert (found.lost, found.unpublished) == (1, 1)


def test_the_schedule_draws_every_kind_once_per_round() -> None:
    kinds = list(KINDS)
    plan = schedule(kinds, len(kinds) * 2 + 3, random.Random(5))
    assert sorted(plan[:len(kinds)]) == sorted(kinds)
    assert sorted(plan[len(kinds):2 * len(kinds)]) == sorted(kinds)
    assert plan == schedule(kinds, len(kinds) * 2 + 3, random.Random(5))


@pytest.mark.parametrize(("value", "expected"), [
    ("", "False False"),
    ('{"mutant": "claim_skipped"}', "True True"),
])
def test_fail_points_and_mutants_exist_only_in_test_mode(value: str, expected: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CONSUMERKIT_TORTURE"}
    if value:
        env["CONSUMERKIT_TORTURE"] = value
    code = ("from consumerkit.shared import faults; faults.inject('after_claim'); "
            "print(faults.ON, faults.inject('claim_skipped'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, check=True,
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == expected


def test_the_switched_on_hook_refuses_a_name_it_does_not_know() -> None:
    """A misspelt fail-point would never fire and a run would pass for the wrong reason."""
    env = {**os.environ, "CONSUMERKIT_TORTURE": '{"mutant": "claim_skipped"}'}
    code = "from consumerkit.shared import faults; faults.inject('before_comit')"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 1
    assert "unknown fail-point or mutant 'before_comit'" in out.stderr


def test_after_a_failover_an_orphan_is_counted_not_a_phantom() -> None:
    """The relay published c1 and c2 from a transaction the failover took back; the producer's
    counter went back too, so the next event of aggregate c is numbered 1 again: the projection
    saw 1 after 2 (one violation, explained by the orphans)."""
    h = clean()
    h.published += ["c1-lost", "c2-lost"]
    h.effects += [("c1-lost", "c", 1), ("c2-lost", "c", 2), ("c1", "c", 1)]
    h.committed["c1"] = Produced("c", 1)
    h.violations = [("c", 1)]
    h.projection_violations = 1
    before = check(h)  # no failover: the relay published what was never committed
    assert (before.phantom, before.orphans, before.projection_violations) == (2, 0, 1)
    assert not before.verdict
    h.failovers = 1
    found = check(h)
    assert (found.orphans, found.orphan_effects, found.orphan_violations) == (2, 2, 1)
    assert (found.phantom, found.projection_violations, found.lost) == (0, 0, 0)
    assert found.verdict
    h.violations.append(("a", 3))  # a violation no orphan explains still fails
    h.projection_violations = 2
    assert check(h).projection_violations == 1
    assert not check(h).verdict


def test_after_a_failover_an_orphan_numbered_in_memory_keeps_its_place() -> None:
    """A transactional producer numbers in memory: t2 reached the topic, its row went with
    the failover, and the producer went on with t3. t2 holds its place in t's sequence, so
    1, 2, 3 is in order; applied out of order it fails like any other event."""
    h = clean()
    h.failovers = 1
    h.committed.update({"t1": Produced("t", 1), "t3": Produced("t", 3)})
    h.published += ["t1", "t2-lost", "t3"]
    h.effects += [("t1", "t", 1), ("t2-lost", "t", 2), ("t3", "t", 3)]
    found = check(h)
    assert (found.orphans, found.order_violations) == (1, 0)
    assert found.verdict
    h.effects[-2:] = [("t3", "t", 3), ("t2-lost", "t", 2)]
    assert check(h).order_violations == 2  # t3 came early, t2 late
    assert not check(h).verdict
