"""What services receive and send, declared once in code: the input of
``consumerkit asyncapi`` (see :mod:`consumerkit.asyncapi`).

A :class:`Receives` is a consumer's side: its topics and its handlers (event types, payload
models, versions and upcasters, as the consumer itself resolves them). A :class:`Sends` is an
event type a service writes to its outbox, with the topic the relay routes it to. An
:class:`EventCatalog` gathers them; a :class:`~consumerkit.Consumer` alone is a catalog of what
it receives (:meth:`EventCatalog.of`).
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel

from .consumer import Consumer
from .envelope import WireFormat
from .errors import ConfigurationError
from .outbox.routing import TopicRoute, check_topic
from .registry import HandlerSource
from .route_table import RouteTable
from .versions import check_version, model_version


@dataclass(frozen=True)
class Receives:
    """A consumer's topics and handlers. A topic may hold parameters in braces
    (``"orders-{region}"``), which the document declares as channel parameters."""

    service: str
    topics: Sequence[str]
    handlers: Sequence[HandlerSource] | RouteTable  # a RouteTable: a consumer's own
    wire: WireFormat = field(default_factory=WireFormat)

    def routes(self) -> RouteTable:
        if isinstance(self.handlers, RouteTable):
            return self.handlers
        return RouteTable.build(self.handlers)


@dataclass(frozen=True)
class Sends:
    """An event type ``service`` writes to its outbox: its payload model, its aggregate type
    and the topic it is published to (a name, or the relay's :class:`TopicRoute`). The
    version is the model's ``__event_version__`` unless given."""

    service: str
    event_type: str
    model: type[BaseModel]
    aggregate_type: str
    topic: str | TopicRoute = field(default_factory=TopicRoute)
    version: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, type) or not issubclass(self.model, BaseModel):
            raise ConfigurationError(f"Sends {self.event_type!r}: model must be a pydantic "
                                     f"model class, not {self.model!r}")
        if self.version is not None:
            check_version(self.version, f"Sends {self.event_type!r} version")

    @property
    def address(self) -> str:
        if isinstance(self.topic, TopicRoute):
            return self.topic.template.format(event_type=self.event_type,
                                              aggregate_type=self.aggregate_type)
        return self.topic

    @property
    def event_version(self) -> int:
        return self.version or model_version(self.model) or 1


@dataclass(frozen=True)
class EventCatalog:
    """The services of one document: what each receives and sends."""

    title: str
    version: str = "1.0.0"
    description: str = ""
    receives: Sequence[Receives] = ()
    sends: Sequence[Sends] = ()

    def __post_init__(self) -> None:
        if not self.receives and not self.sends:
            raise ConfigurationError(f"event catalog {self.title!r} receives and sends nothing")
        for address in [t for r in self.receives for t in r.topics] + [
                s.address for s in self.sends]:
            # a topic Kafka accepts once each parameter has a value
            check_topic(address.format_map(dict.fromkeys(parameters(address), "x")))

    @classmethod
    def of(cls, consumer: Consumer, route: TopicRoute | None = None) -> EventCatalog:
        """What ``consumer`` receives, and what its handlers declare they publish through its
        outbox (``@handler(..., publishes=[...])``), to the topics ``route`` (the relay's,
        ``{aggregate_type}`` by default) names."""
        route = route or TopicRoute()
        table = consumer.routes
        declared: dict[str, Sends] = {}
        for handler in [*table.by_type.values(), *table.by_topic.values()]:
            for p in handler.publishes or ():
                sends = Sends(consumer.name, p.event_type, p.model, p.aggregate_type, route,
                              p.version)
                if declared.setdefault(p.event_type, sends) != sends:
                    raise ConfigurationError(
                        f"two handlers of {consumer.name} declare {p.event_type!r} "
                        "differently (model, aggregate type or version)")
        return cls(title=consumer.name, receives=[Receives(
            consumer.name, consumer.topics, table, consumer.wire)], sends=list(declared.values()))


def parameters(address: str) -> list[str]:
    """The ``{name}`` parameters of a topic address; :class:`ConfigurationError` if it holds
    anything else in braces (a format spec, a conversion, an empty name)."""
    try:
        parts = list(string.Formatter().parse(address))
    except ValueError as exc:
        raise ConfigurationError(f"topic {address!r}: {exc}") from None
    names: list[str] = []
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            raise ConfigurationError(f"topic {address!r}: a parameter is written {{name}}")
        if name not in names:
            names.append(name)
    return names
