"""SIGTERM / SIGINT for every consumer running on a loop: one process-wide handler that fans
out, so two consumers in one process both drain, and the default handler comes back only when
the last of them stops."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable

SIGNALS = (signal.SIGTERM, signal.SIGINT)
Callback = Callable[[signal.Signals], None]

_listeners: dict[asyncio.AbstractEventLoop, list[Callback]] = {}


def install(callback: Callback) -> Callable[[], None]:
    """Call ``callback(sig)`` on SIGTERM/SIGINT until the returned function is called. Does
    nothing outside the main thread (where signal handlers cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    loop = asyncio.get_running_loop()
    listeners = _listeners.setdefault(loop, [])
    if not listeners:
        for sig in SIGNALS:
            loop.add_signal_handler(sig, _notify, loop, sig)
    listeners.append(callback)

    def remove() -> None:
        listeners.remove(callback)
        if not listeners:
            del _listeners[loop]
            for sig in SIGNALS:
                loop.remove_signal_handler(sig)

    return remove


def _notify(loop: asyncio.AbstractEventLoop, sig: signal.Signals) -> None:
    for callback in list(_listeners.get(loop, ())):
        callback(sig)
