"""An AsyncAPI 3.0 document from an :class:`~consumerkit.catalog.EventCatalog`.

Topics become channels (a ``{name}`` in a topic becomes a channel parameter). Each event type
becomes one message per version: the handler's version (or the sent version) with the JSON
Schema of its pydantic model and the headers of the wire format, and for a handler that takes
version ``n`` through upcasters, one message for each older version, whose payload is an
object carried to version ``n`` by the named upcasters (its old model is no longer in the
code). Each service gets a ``receive`` operation per topic it consumes and a ``send``
operation per topic its outbox is routed to.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from .catalog import EventCatalog, Receives, Sends, parameters
from .envelope import WireFormat
from .errors import ConfigurationError
from .registry import Route

ASYNCAPI_VERSION = "3.0.0"
CONTENT_TYPE = "application/json"
_KEY = re.compile(r"[^A-Za-z0-9_.-]+")
_SCHEMAS = "#/components/schemas/{model}"


def key(text: str) -> str:
    """``text`` as a component key (AsyncAPI allows letters, digits, ``.``, ``-`` and ``_``)."""
    return _KEY.sub("_", text).strip("_") or "_"


def document(catalog: EventCatalog) -> dict[str, Any]:
    """The AsyncAPI 3.0 document of ``catalog``, as a JSON-ready dict."""
    doc = _Doc(catalog)
    for receives in catalog.receives:
        doc.receive(receives)
    for sends in catalog.sends:
        doc.send(sends)
    return doc.render()


class _Doc:
    def __init__(self, catalog: EventCatalog) -> None:
        self.catalog = catalog
        models = _models(catalog)
        refs, defs = models_json_schema([(m, "validation") for m in models],
                                        ref_template=_SCHEMAS)
        self.payloads = {m: refs[(m, "validation")] for m in models}
        self.schemas: dict[str, Any] = defs.get("$defs", {})
        self.channels: dict[str, dict[str, Any]] = {}
        self.messages: dict[str, dict[str, Any]] = {}
        self.operations: dict[str, dict[str, Any]] = {}

    def receive(self, receives: Receives) -> None:
        routes = receives.routes()
        found = [*routes.by_type.values(), *routes.by_topic.values()]
        for topic in receives.topics:
            names: list[str] = []
            for route in found:
                if route.topic is not None and route.topic != topic:
                    continue
                chain = routes.chains.get(route.event_type or "")
                for version in range(1, route.version + 1):
                    upcasters = ([getattr(f, "__name__", "?")
                                  for f in chain.steps[version - 1:]] if chain else [])
                    if version < route.version and not upcasters:
                        continue  # no upcasters: only the handler's version is taken
                    names.append(self._message(
                        route.event_type or route.topic or topic, version, receives.wire,
                        route.model if version == route.version else None,
                        upcasters, route.event_type is None))
            self._operation(receives.service, "receive", topic, names)

    def send(self, sends: Sends) -> None:
        name = self._message(sends.event_type, sends.event_version, WireFormat(), sends.model,
                             [], False)
        self._operation(sends.service, "send", sends.address, [name])

    def _message(self, event_type: str, version: int, wire: WireFormat,
                 model: type[BaseModel] | None, upcasters: list[str], topic_route: bool,
                 ) -> str:
        message: dict[str, Any] = {
            "name": event_type, "title": f"{event_type} version {version}",
            "contentType": CONTENT_TYPE,
            "headers": _headers(wire, event_type, version, topic_route),
        }
        if model is not None:
            message["payload"] = self.payloads[model]
            if model.__doc__:
                message["summary"] = " ".join(model.__doc__.split())
        else:
            message["payload"] = {"type": "object", "description": (
                f"version {version}, no longer modelled in the code: the upcasters "
                f"{', '.join(upcasters)} carry it to version {version + len(upcasters)}")}
        name = key(f"{event_type}.v{version}")
        n = 1
        while name in self.messages and self.messages[name] != message:
            n += 1  # two services with different models of one version: keep both
            name = key(f"{event_type}.v{version}.{n}")
        self.messages[name] = message
        return name

    def _operation(self, service: str, action: str, address: str, names: list[str]) -> None:
        channel = self._channel(address)
        messages = self.channels[channel].setdefault("messages", {})
        for name in names:
            messages[name] = {"$ref": f"#/components/messages/{name}"}
        op = key(f"{service}.{action}.{channel}")
        existing = self.operations.setdefault(op, {
            "action": action, "channel": {"$ref": f"#/channels/{channel}"},
            "summary": f"{service} {action}s on {address}", "messages": []})
        refs = existing["messages"]
        for name in names:
            ref = {"$ref": f"#/channels/{channel}/messages/{name}"}
            if ref not in refs:
                refs.append(ref)

    def _channel(self, address: str) -> str:
        name = key(address.replace("{", "").replace("}", ""))
        channel = self.channels.get(name)
        if channel is not None and channel["address"] != address:
            raise ConfigurationError(f"topics {channel['address']!r} and {address!r} share "
                                     f"the channel key {name!r}")
        if channel is None:
            channel = self.channels[name] = {"address": address}
            params = parameters(address)
            if params:
                channel["parameters"] = {p: {"description": f"the {p} part of the topic name"}
                                         for p in params}
        return name

    def render(self) -> dict[str, Any]:
        catalog = self.catalog
        info: dict[str, Any] = {"title": catalog.title, "version": catalog.version}
        if catalog.description:
            info["description"] = catalog.description
        components: dict[str, Any] = {"messages": self.messages}
        if self.schemas:
            components["schemas"] = self.schemas
        return {"asyncapi": ASYNCAPI_VERSION, "info": info,
                "defaultContentType": CONTENT_TYPE, "channels": self.channels,
                "operations": self.operations, "components": components}


def _headers(wire: WireFormat, event_type: str, version: int, topic_route: bool,
             ) -> dict[str, Any]:
    """The headers of the wire format (docs/wire-format.md) as a JSON Schema."""
    text = {"type": "string"}
    props: dict[str, Any] = {
        wire.id_header: {**text, "description": "the event id, the dedup key"},
        wire.event_type_header: (
            {**text, "description": "the event type"} if topic_route
            else {**text, "const": event_type}),
        wire.event_version_header: {**text, "const": str(version), "description": (
            "the payload's schema version; absent means 1")},
        wire.occurred_at_header: {**text, "format": "date-time"},
        wire.aggregate_type_header: text,
        wire.correlation_id_header: text,
        wire.causation_id_header: text,
        wire.traceparent_header: {**text, "description": "W3C trace context"},
    }
    required = [] if wire.id_payload_field or wire.id_from_position else [wire.id_header]
    if not topic_route:
        required.append(wire.event_type_header)
    if version > 1:
        required.append(wire.event_version_header)
    return {"type": "object", "properties": props, "required": required}


def _models(catalog: EventCatalog) -> list[type[BaseModel]]:
    found: list[type[BaseModel]] = []
    routes: Iterable[Route] = (
        route for r in catalog.receives
        for table in [r.routes()] for route in [*table.by_type.values(),
                                                 *table.by_topic.values()])
    for model in [*(r.model for r in routes), *(s.model for s in catalog.sends)]:
        if model not in found:
            found.append(model)
    return found
