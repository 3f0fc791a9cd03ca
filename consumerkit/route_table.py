"""The routes of a consumer's handlers, indexed once by event type and by topic, and read
for every message (:class:`~consumerkit.engine.decode.Decoder`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .errors import HandlerDefinitionError
from .registry import HandlerRegistry, HandlerSource, Route
from .versions import Chain, build_chains


@dataclass(frozen=True, slots=True)
class RouteTable:
    """Routes indexed by event type and by topic; built once, read per message."""

    by_type: dict[str, Route]
    by_topic: dict[str, Route]
    chains: dict[str, Chain] = field(default_factory=dict)  # upcasters by event type

    @classmethod
    def build(cls, sources: Iterable[HandlerSource]) -> RouteTable:
        sources = list(sources)
        registry = HandlerRegistry(sources)
        for source in (registry, *sources):
            if isinstance(source, HandlerRegistry):
                source.freeze()
        by_type: dict[str, Route] = {}
        by_topic: dict[str, Route] = {}
        for route in registry.routes():
            table, key = (by_type, route.event_type) if route.event_type else (
                by_topic, route.topic)
            assert key is not None
            if key in table:
                raise HandlerDefinitionError(
                    f"two handlers for {key!r}: {table[key].name} and {route.name}"
                )
            table[key] = route
        if not by_type and not by_topic:
            raise HandlerDefinitionError("no handlers given")
        versions = {key: route.version for key, route in by_type.items()}
        return cls(by_type, by_topic, build_chains(versions, registry.upcasters()))

    def find(self, event_type: str | None, topic: str) -> Route | None:
        if event_type is not None and (route := self.by_type.get(event_type)) is not None:
            return route
        return self.by_topic.get(topic)
