"""What every local service shares: its error, and a free port to put it on."""

from __future__ import annotations

import socket

from ..errors import ServiceStartError

__all__ = ["ServiceStartError", "free_port"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
