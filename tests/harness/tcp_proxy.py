"""A small TCP proxy on loopback that can hold its traffic back: the fault a network partition
would be, without root, iptables or toxiproxy.

While held, every byte stays where it is (in this proxy or the kernel's buffers) and nothing
reaches the other side; :meth:`TcpProxy.close` drops what was held, so bytes sent while held
are never delivered. Each direction of each connection is one daemon thread doing blocking
reads, which ``close()`` ends by shutting the sockets down.
"""

from __future__ import annotations

import contextlib
import socket
import threading

__all__ = ["TcpProxy"]

_CHUNK = 65536


class TcpProxy:
    """Forwards connections made to ``127.0.0.1:port`` to ``127.0.0.1:target_port``."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._open = threading.Event()
        self._open.set()
        self._closed = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.held_bytes = 0  # bytes read while held (never delivered if closed while held)
        threading.Thread(target=self._accept, name=f"proxy-{self.port}", daemon=True).start()

    @property
    def held(self) -> bool:
        return not self._open.is_set()

    def hold(self) -> None:
        """From now on, deliver nothing in either direction until :meth:`release`."""
        self._open.clear()

    def release(self) -> None:
        """Deliver again, starting with what was held."""
        self._open.set()

    def close(self) -> None:
        """Drop every connection and whatever it held; accept no more."""
        with self._lock:
            self._closed = True
            sockets, self._sockets = self._sockets, []
        for sock in [self._listener, *sockets]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self._open.set()  # wake the pumps, which find their sockets closed

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self._sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(_CHUNK):
                if not self._open.is_set():
                    self.held_bytes += len(data)
                    self._open.wait()
                if self._closed:
                    return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):  # one side gone: end the other as well
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
