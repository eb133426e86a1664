"""A loopback HTTP/1.1 server for tests of what the Storage clients put on the wire."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable

OK = (
    b"HTTP/1.1 201 Created\r\nContent-Type: application/xml\r\nx-ms-request-id: r-1\r\n"
    b"x-ms-meta: a\r\nx-ms-meta: b\r\nContent-Length: 5\r\n\r\nhello"
)


class Server:
    """A loopback HTTP/1.1 server that keeps each request's raw bytes and answers what
    ``answer`` returns (None: never answers; b"": closes without a word), then closes the
    connection if ``close_after``; over TLS with ``tls`` (a server context)."""

    def __init__(
        self,
        answer: Callable[[bytes], bytes | None] = lambda _: OK,
        close_after: bool = False,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.answer = answer
        self.close_after = close_after
        self.tls = tls
        self.requests: list[bytes] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._open: list[socket.socket] = []
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self._open.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            self._exchange(conn)
        except OSError:
            return  # closed by close(), or a handshake the client refused

    def _exchange(self, conn: socket.socket) -> None:
        buffer = b""
        while True:
            while b"\r\n\r\n" not in buffer:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                buffer += chunk
            head, _, rest = buffer.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            while len(rest) < length:
                rest += conn.recv(65536)
            self.requests.append(head + b"\r\n\r\n" + rest[:length])
            buffer = rest[length:]
            reply = self.answer(self.requests[-1])
            if reply is None:
                self._stop.wait(30)
                return
            if not reply:
                conn.close()
                return
            conn.sendall(reply)
            if self.close_after:
                conn.close()
                return

    def url(self, path: str) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        for conn in self._open:
            conn.close()
