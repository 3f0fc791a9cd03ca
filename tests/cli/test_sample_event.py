"""The event ``check --try-handlers`` builds for a handler no waiting record was found for:
the model's own example first, else each required field's example or a plain value of its
type, defaults left to the model; a model no value can be made up for is said, with why."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Literal
from uuid import UUID

import pytest
from pydantic import BaseModel, ConfigDict, Field

from consumerkit.cli.sample_event import Unbuildable, sample


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Line(BaseModel):
    sku: str
    quantity: int


class Order(BaseModel):
    order_id: str = Field(examples=["o-42"])
    placed_at: datetime
    kind: Literal["web", "shop"]
    colour: Colour
    lines: list[Line]
    first: Line
    customer: UUID
    note: str | None
    total: float
    paid: bool
    currency: str = "EUR"


class WithExample(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"code": "A-1"}]})
    code: str = Field(pattern=r"^[A-Z]-\d$")


class Opaque:
    pass


class HoldsOpaque(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    thing: Opaque


def test_a_minimal_instance_of_every_field_kind() -> None:
    order = sample(Order)
    assert isinstance(order, Order)
    assert order.order_id == "o-42"  # the field's example
    assert order.kind == "web"
    assert order.colour is Colour.RED
    assert order.lines == []
    assert order.first == Line(sku="example", quantity=1)
    assert order.note is None
    assert order.currency == "EUR"


def test_the_models_example_comes_first() -> None:
    assert sample(WithExample) == WithExample(code="A-1")


def test_a_constraint_the_plain_value_misses_is_said() -> None:
    class Strict(BaseModel):
        code: str = Field(pattern=r"^[A-Z]-\d$")

    with pytest.raises(Unbuildable, match="the minimal instance is not valid: code"):
        sample(Strict)


def test_a_type_no_value_can_be_made_up_for_is_said() -> None:
    with pytest.raises(Unbuildable, match="field 'thing'"):
        sample(HoldsOpaque)
