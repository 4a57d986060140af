"""A TCP proxy on loopback that a test can cut and restore: a server made unreachable to one
client without stopping it (the shared PostgreSQL serves the other tests meanwhile).

``cut()`` stops listening, so the port refuses new connections as a stopped server's does,
and resets the connections already made, as a server's crash does to its clients. ``restore()``
listens on the same port again.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                # SO_LINGER 0: closing sends a reset, as a crashed server's kernel does.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00" * 2)
                sock.close()

    close = cut

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._listener is not listener:  # cut meanwhile
                    client.close()
                    upstream.close()
                    return
                self._sockets |= {client, upstream}
            pair = _Pair(self, client, upstream)
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=pair.pipe, args=(source, sink), daemon=True).start()

    def _forget(self, *sockets: socket.socket) -> None:
        with self._lock:
            self._sockets -= set(sockets)
        for sock in sockets:
            sock.close()


class _Pair:
    """A client's connection and its upstream one, closed once both directions ended."""

    def __init__(self, proxy: TcpProxy, client: socket.socket, upstream: socket.socket) -> None:
        self.proxy, self.sockets = proxy, (client, upstream)
        self.open_directions = 2
        self.lock = threading.Lock()

    def pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)
            with self.lock:
                self.open_directions -= 1
                done = self.open_directions == 0
            if done:
                self.proxy._forget(*self.sockets)
