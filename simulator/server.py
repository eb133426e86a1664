"""HTTP front of the simulator: a stdlib ThreadingHTTPServer bound to 127.0.0.1.

    with SimulatorServer(faults=RandomFaults(transient_rate=0.1), ledger_path=p) as sim:
        httpx.post(f"{sim.url}/process", json=order, headers={"Idempotency-Key": ...})
        sim.effects(); sim.stats()

Endpoints: ``POST /{step}`` (contract 3.4), ``GET /_health``, ``GET /_ledger``,
``GET /_stats``, ``POST /_reset``. HTTP/1.1 keep-alive, one write per answer,
no request logging unless ``verbose``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from simulator.engine import Outcome, Simulator, json_outcome
from simulator.faults import STEP_PATTERN, RandomFaults
from simulator.ledger import Effect, Ledger

HOST: Final = "127.0.0.1"
MAX_BODY_BYTES: Final = 1 << 20


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default backlog is 5: a burst of new connections from
    # several app processes would overflow it and wait a 1 s SYN retry.
    request_queue_size = 1024

    def __init__(self, port: int, simulator: Simulator, verbose: bool) -> None:
        self.simulator = simulator
        self.verbose = verbose
        # Open connections, so stop() can cut idle keep-alive ones: their
        # threads would otherwise keep serving after the listener closed.
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__((HOST, port), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if isinstance(request, socket.socket):
            with self._connections_lock:
                self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that give up (timeouts, dropped connections) are routine here.
        if self.verbose:
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _HTTPServer

    def do_POST(self) -> None:
        body = self._read_body()
        if body is None:
            return
        path = self.path.partition("?")[0]
        simulator = self.server.simulator
        if path == "/_reset":
            simulator.reset()
            self._send(json_outcome(200, {"reset": True}))
            return
        step = path[1:]
        if not path.startswith("/") or not STEP_PATTERN.fullmatch(step):
            self._send(json_outcome(404, {"error": f"No step at {path!r}; POST /<step>."}))
            return
        self._send(simulator.handle(step, self.headers.get("Idempotency-Key"), body))

    def do_GET(self) -> None:
        path = self.path.partition("?")[0]
        simulator = self.server.simulator
        if path == "/_health":
            self._send(json_outcome(200, {"status": "ok"}))
        elif path == "/_ledger":
            self._send(json_outcome(200, {"effects": simulator.effects()}))
        elif path == "/_stats":
            self._send(json_outcome(200, simulator.stats()))
        else:
            self._send(json_outcome(404, {"error": f"Nothing at {path!r}."}))

    def _read_body(self) -> bytes | None:
        """The request body, or None after refusing the request (and closing)."""
        error = ""
        length = 0
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            status, error = 411, "Send the body with a Content-Length, not chunked."
        else:
            try:
                length = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                status, error = 400, "The Content-Length header is not an integer."
            else:
                if not 0 <= length <= MAX_BODY_BYTES:
                    status, error = 413, f"The body must be at most {MAX_BODY_BYTES} bytes."
        if error:
            self.close_connection = True
            self._send(json_outcome(status, {"error": error}))
            return None
        return self.rfile.read(length) if length else b""

    def _send(self, outcome: Outcome) -> None:
        if outcome.dropped:
            # No status line, no bytes: the client sees the connection close.
            self.close_connection = True
            return
        phrase = self.responses.get(outcome.status, ("Unknown",))[0]
        lines = [
            f"HTTP/1.1 {outcome.status} {phrase}",
            "Content-Type: application/json",
            f"Content-Length: {len(outcome.body)}",
        ]
        lines.extend(f"{name}: {value}" for name, value in outcome.headers)
        if self.close_connection:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        try:
            self.wfile.write(head + outcome.body)
        except OSError:
            self.close_connection = True  # the client left (timed out on a hang)
        if self.server.verbose:
            self.log_request(outcome.status, len(outcome.body))

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            super().log_message(format, *args)


class SimulatorServer:
    """The simulator on a free loopback port, served from a background thread."""

    def __init__(
        self,
        *,
        faults: RandomFaults | None = None,
        compensations: Mapping[str, str] | None = None,
        ledger_path: str | Path | None = None,
        port: int = 0,
        verbose: bool = False,
    ) -> None:
        self.simulator = Simulator(
            random_faults=faults, compensations=compensations, ledger=Ledger(ledger_path)
        )
        self._port = port
        self._verbose = verbose
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopped = False

    def start(self) -> SimulatorServer:
        if self._httpd is not None:
            raise RuntimeError("The simulator is already started.")
        self._httpd = _HTTPServer(self._port, self.simulator, self._verbose)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="simulator-http",
            daemon=True,
        )
        self._thread.start()
        return self

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("The simulator is not started.")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def effects(self) -> list[Effect]:
        return self.simulator.effects()

    def stats(self) -> dict[str, Any]:
        return self.simulator.stats()

    def reset(self) -> None:
        self.simulator.reset()

    def stop(self) -> None:
        """Stop promptly: hung calls wake and drop, idle connections are cut."""
        if self._httpd is None or self._stopped:
            return
        self._stopped = True
        self.simulator.stop()
        self._httpd.shutdown()
        self._httpd.close_connections()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self.simulator.ledger.close()

    def __enter__(self) -> SimulatorServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


__all__ = ["HOST", "SimulatorServer"]
