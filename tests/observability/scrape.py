"""Reading the metrics endpoint as Prometheus would."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


async def get(port: int, path: str) -> tuple[int, str]:
    """``(status, body)`` of ``GET path``, or ``(0, error)`` while nothing listens."""
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            response = await client.get(f"http://127.0.0.1:{port}{path}")
    except httpx.TransportError as exc:
        return 0, repr(exc)
    return response.status_code, response.text


async def samples(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of ``/metrics`` by (name, labels)."""
    status, body = await get(port, "/metrics")
    assert status == 200, body
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def value(found: dict[tuple[str, frozenset[tuple[str, str]]], float], metric: str, /,
          **labels: str) -> float | None:
    """The sample ``metric`` whose labels include ``labels`` (summed over the others)."""
    matches = [v for (n, ls), v in found.items() if n == metric and set(labels.items()) <= ls]
    return sum(matches) if matches else None
