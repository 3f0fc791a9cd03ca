"""The collector's settings for a process that runs a consumer or a relay.

CPython's cyclic collector runs each time 700 more objects were allocated than freed. A
consumer keeps thousands of records in flight, each a few objects, so the young generation
fills quickly with live objects and is walked again and again; its full passes also walk
everything start-up created (modules, compiled validators, pools). Measured on the main
benchmark cell, collections took about as much CPU as the messages themselves.

``tune_gc()`` runs once start-up is complete: it collects, moves every object alive into the
permanent generation (``gc.freeze``: never walked again) and raises the young generation's
threshold. Cycles are still collected, less often; objects freed by reference counting (nearly
all of them) are not affected. ``consumerkit run`` and ``consumerkit relay`` call it unless
``CONSUMERKIT_GC_TUNING=false``; a program that embeds a consumer in its own process decides
for itself (see docs/operations/index.md).
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000
"""Allocations (net of frees) between two young collections, instead of CPython's 700."""


def tune_gc(young: int = YOUNG_THRESHOLD) -> str:
    """Collect, freeze what is alive, raise the young threshold (never lowers it); return
    what was done, for the start-up log."""
    gc.collect()
    gc.freeze()
    first, middle, old = gc.get_threshold()
    first = max(first, young)
    gc.set_threshold(first, middle, old)
    return (f"{gc.get_freeze_count():,} start-up objects frozen, young generation collected "
            f"every {first:,} allocations")


def describe() -> str:
    """The collector's state in words, for benchmark reports."""
    first, middle, old = gc.get_threshold()
    frozen = gc.get_freeze_count()
    state = f"thresholds {first}/{middle}/{old}"
    if frozen:
        state += f", {frozen:,} objects frozen"
    return state if gc.isenabled() else "disabled"
