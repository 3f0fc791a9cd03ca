"""Per-record objects built fast are the frozen dataclasses their constructors build."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest

from consumerkit.engine.frozen import maker
from consumerkit.envelope import Envelope, Record
from consumerkit.types import ClaimRequest

FIELDS: tuple[Any, ...] = ("e-1", "header", "order.created", "k", "orders", 2, 41,
          datetime(2026, 1, 1, tzinfo=UTC))


def test_an_envelope_made_fast_is_an_envelope_equal_to_one_constructed() -> None:
    made = maker(Envelope)(*FIELDS)
    assert type(made) is Envelope
    assert made == Envelope(*FIELDS)
    assert made.headers == {}  # the defaults, as constructed
    assert made.traceparent is None
    assert made.headers is not maker(Envelope)(*FIELDS).headers  # a fresh default each
    assert dataclasses.replace(made, key="j").key == "j"
    assert repr(made) == repr(Envelope(*FIELDS))


def test_it_stays_frozen() -> None:
    made = maker(Envelope)(*FIELDS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.key = "j"  # type: ignore[misc]
    request = maker(ClaimRequest)(made, "h")
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.handler = "g"  # type: ignore[misc]
    assert request == ClaimRequest(made, "h")


def test_only_frozen_slotted_dataclasses_are_taken() -> None:
    @dataclasses.dataclass(slots=True)
    class Plain:
        x: int

    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        x: int

    class NotADataclass:
        __slots__ = ("x",)

    for cls in (Plain, NoSlots, NotADataclass):
        with pytest.raises(TypeError, match="not a frozen slotted dataclass"):
            maker(cls)
    assert maker(Record)("t", 0, 1, None, b"v") == Record("t", 0, 1, None, b"v")
