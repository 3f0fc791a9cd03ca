"""An instance of a handler's payload model, for ``check --try-handlers`` when no waiting
record of its type was found: the model's own JSON Schema examples first, else a minimal
document (each required field's example, or a plain value of its type; defaults left to the
model), validated by the model."""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ValidationError

from ..engine.decode import _short


class Unbuildable(Exception):
    """No instance of the model could be built; ``str()`` says why."""


def sample(model: type[BaseModel]) -> BaseModel:
    """An instance of ``model`` (raises :class:`Unbuildable` with why if none)."""
    try:
        examples = model.model_json_schema().get("examples") or ()
    except Exception:  # a field no JSON Schema describes (arbitrary types): no examples
        examples = ()
    for example in examples:
        try:
            return model.model_validate(example)
        except ValidationError:
            continue
    try:
        return model.model_validate(_document(model))
    except ValidationError as exc:
        raise Unbuildable(f"the minimal instance is not valid: {_short(exc)}") from exc


def _document(model: type[BaseModel]) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if not info.is_required():
            continue
        key = info.alias or name
        doc[key] = info.examples[0] if info.examples else _value(info.annotation, name)
    return doc


_PLAIN: dict[type, Any] = {str: "example", bool: False, int: 1, float: 1.0,
                           Decimal: "1", bytes: "", UUID: "00000000-0000-4000-8000-000000000001"}


def _value(annotation: Any, name: str) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is None or annotation is type(None):
        return None
    if origin is typing.Annotated:
        return _value(args[0], name)
    if origin is typing.Literal:
        return args[0]
    if origin is typing.Union or origin is types.UnionType:
        return None if type(None) in args else _value(args[0], name)
    if origin in (list, set, frozenset, tuple) or (
            isinstance(origin, type) and issubclass(origin, Sequence)):
        return []
    if origin is dict or (isinstance(origin, type) and issubclass(origin, Mapping)):
        return {}
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return _document(annotation)
        if issubclass(annotation, enum.Enum):
            return next(iter(annotation)).value
        if issubclass(annotation, datetime):
            return datetime.now(UTC).isoformat()
        if issubclass(annotation, date):
            return date.today().isoformat()
        if issubclass(annotation, time):
            return "00:00:00"
        for kind, value in _PLAIN.items():
            if issubclass(annotation, kind):
                return value
    raise Unbuildable(f"no value of {annotation!r} can be made up for field {name!r} (give "
                      "the model an example: model_config json_schema_extra examples)")

