"""HTTP front of the simulator: a stdlib ThreadingHTTPServer bound to 127.0.0.1.

(Over 400 lines: the outage phases need the raw socket — refusing connections,
cutting open ones, listening again on the same port — which a framework hides.)

    with SimulatorServer(faults=RandomFaults(transient_rate=0.1), ledger_path=p) as sim:
        httpx.post(f"{sim.url}/process", json=order, headers={"Idempotency-Key": ...})
        sim.effects(); sim.stats(); sim.calls(since=...)
        sim.start_outage([Phase.error(20, status=503), Phase.unreachable(15)])

Endpoints: ``POST /{step}`` (docs/contracts.md §3.4; ids and compensations that must name
them: ``simulator.engine``; callbacks: ``simulator.callbacks``), ``GET /health`` (the
service's own health, set by ``GET|POST /_healthcheck``: ``simulator.healthcheck``),
``GET /_health`` (the simulator's, always 200), ``GET /_ledger``,
``GET /_stats``, ``GET /_calls[?since=ISO]``, ``GET|POST /_outage``, ``POST /_reset``, and
a managed identity endpoint with steps that require its tokens (``simulator.identity``):
``GET /_identity/token``, ``GET|POST /_identity``.
HTTP/1.1 keep-alive, one write per answer, no request logging unless ``verbose``.

An unreachable outage phase closes the listening socket (new connections are
refused), cuts open connections, and later listens again on the same port with a
fresh listener; the Simulator (keys, ledger, stats, call log) lives on throughout.
"""

from __future__ import annotations

import contextlib
import json
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Final
from urllib.parse import unquote

from simulator.callbacks import DEFAULT_CALLBACK_MS
from simulator.calllog import DEFAULT_CALL_LOG_SIZE, CallLog
from simulator.engine import Answer, Simulator, json_answer
from simulator.faults import STEP_PATTERN, RandomFaults
from simulator.healthcheck import HealthError, HealthSwitch
from simulator.identity import DEFAULT_TOKEN_SECONDS, IdentityEndpoint
from simulator.ledger import Effect, Ledger
from simulator.outage import (
    MAX_OUTAGE_SECONDS,
    OutageError,
    Phase,
    parse_outage,
    parse_outage_body,
    parse_outage_cli,
    total_seconds,
)

HOST: Final = "127.0.0.1"
MAX_BODY_BYTES: Final = 1 << 20
#: How long to keep trying to listen again after an unreachable phase.
RELISTEN_SECONDS: Final = 10.0


class _HTTPServer(ThreadingHTTPServer):
    """One listening period: a new instance each time the port listens again."""

    daemon_threads = True
    # socketserver's default backlog is 5: a burst of new connections from
    # several app processes would overflow it and wait a 1 s SYN retry.
    request_queue_size = 1024

    def __init__(self, port: int, owner: SimulatorServer) -> None:
        self.owner = owner
        self.simulator = owner.simulator
        self.verbose = owner.verbose
        # Open connections, so stop() can cut idle keep-alive ones: their
        # threads would otherwise keep serving after the listener closed.
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__((HOST, port), _Handler)

    def server_bind(self) -> None:
        # HTTPServer's version also resolves the host's FQDN, which nothing here uses.
        socketserver.TCPServer.server_bind(self)
        self.server_name = HOST
        self.server_port = int(self.server_address[1])

    def process_request(self, request: Any, client_address: Any) -> None:
        if isinstance(request, socket.socket):
            with self._connections_lock:
                self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self, keep: socket.socket | None = None) -> None:
        """Cut every open connection but ``keep``."""
        with self._connections_lock:
            connections = [c for c in self._connections if c is not keep]
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def stop_listening(self) -> None:
        """Refuse new connections now (Linux: shutdown() stops a listening socket)."""
        with contextlib.suppress(OSError):
            self.socket.shutdown(socket.SHUT_RDWR)

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
            self.server.owner.reset()
            self._send(json_answer(200, {"reset": True}))
            return
        if path == "/_healthcheck":
            try:
                status = self.server.owner.health.set(json.loads(body or b"null"))
            except (HealthError, ValueError) as exc:  # also JSONDecodeError
                self._send(json_answer(400, {"error": str(exc)}))
                return
            self._send(json_answer(200, status))
            return
        if path == "/_outage":
            self._post_outage(body)
            return
        if path == "/_identity":
            self._post_identity(body)
            return
        step = path[1:]
        if not path.startswith("/") or not STEP_PATTERN.fullmatch(step):
            self._send(json_answer(404, {"error": f"No step at {path!r}; POST /<step>."}))
            return
        self._send(
            simulator.handle(
                step,
                self.headers.get("Idempotency-Key"),
                body,
                self.headers.get("Authorization"),
            )
        )

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        simulator = self.server.simulator
        if path == "/_health":
            self._send(json_answer(200, {"status": "ok"}))
        elif path == "/health":
            self._send(json_answer(*self.server.owner.health.answer()))
        elif path == "/_healthcheck":
            self._send(json_answer(200, self.server.owner.health.status()))
        elif path == "/_ledger":
            self._send(json_answer(200, {"effects": simulator.effects()}))
        elif path == "/_stats":
            self._send(json_answer(200, self.server.owner.stats()))
        elif path == "/_calls":
            self._get_calls(query)
        elif path == "/_outage":
            self._send(json_answer(200, self.server.owner.outage_status()))
        elif path == "/_identity/token":
            identity = self.server.owner.identity
            self._send(identity.issue(query, self.headers.get("X-IDENTITY-HEADER")))
        elif path == "/_identity":
            self._send(json_answer(200, self.server.owner.identity.status()))
        else:
            self._send(json_answer(404, {"error": f"Nothing at {path!r}."}))

    def _post_outage(self, body: bytes) -> None:
        try:
            phases = parse_outage_body(body)
        except OutageError as exc:
            self._send(json_answer(400, {"error": str(exc)}))
            return
        owner = self.server.owner
        if phases and phases[0].mode == "unreachable":
            # This connection is kept open for the answer, then closed; the
            # listener is already closed when the answer leaves.
            self.close_connection = True
        try:
            status = owner.start_outage(phases, keep=self.connection)
        except RuntimeError as exc:  # the server is stopping
            self.close_connection = True
            self._send(json_answer(503, {"error": str(exc)}))
            return
        self._send(json_answer(200, status))

    def _post_identity(self, body: bytes) -> None:
        try:
            status = self.server.owner.identity.configure_json(json.loads(body or b"{}"))
        except ValueError as exc:  # also JSONDecodeError
            self._send(json_answer(400, {"error": str(exc)}))
            return
        self._send(json_answer(200, status))

    def _get_calls(self, query: str) -> None:
        params: dict[str, str] = {}
        for part in query.split("&"):
            if part:
                name, _, value = part.partition("=")
                params[unquote(name)] = unquote(value)  # not unquote_plus: keep "+00:00"
        unknown = sorted(set(params) - {"since"})
        if unknown:
            message = f"Unknown parameter(s) {', '.join(unknown)}; GET /_calls?since=<ISO time>."
            self._send(json_answer(400, {"error": message}))
            return
        log = self.server.simulator.call_log
        try:
            calls = log.entries(params.get("since"))
        except ValueError as exc:
            self._send(json_answer(400, {"error": str(exc)}))
            return
        self._send(
            json_answer(200, {"calls": calls, "evicted": log.evicted, "capacity": log.capacity})
        )

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
            self._send(json_answer(status, {"error": error}))
            return None
        return self.rfile.read(length) if length else b""

    def _send(self, outcome: Answer) -> None:
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


@dataclass(frozen=True, slots=True)
class _Planned:
    phase: Phase
    start: float  # time.monotonic()
    end: float


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
        call_log_size: int = DEFAULT_CALL_LOG_SIZE,
        identity_header: str | None = None,
        require_token: Mapping[str, str] | None = None,
        token_seconds: int = DEFAULT_TOKEN_SECONDS,
        ids: Mapping[str, str] | None = None,
        callback_ms: int = DEFAULT_CALLBACK_MS,
    ) -> None:
        #: The managed identity endpoint and the steps that require its tokens.
        self.identity = IdentityEndpoint(
            header=identity_header, require=require_token, token_seconds=token_seconds
        )
        #: The service's own health endpoint (``GET /health``), set on its own.
        self.health = HealthSwitch()
        self.simulator = Simulator(
            random_faults=faults,
            compensations=compensations,
            ledger=Ledger(ledger_path),
            call_log=CallLog(call_log_size),
            identity=self.identity,
            ids=ids,
            callback_ms=callback_ms,
        )
        self._port = port
        self.verbose = verbose
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._started = False
        self._stopped = False
        self._listening = False
        # _control_lock serialises start_outage/end_outage/stop; the outage
        # thread takes only _listen_lock (it is joined under _control_lock).
        self._control_lock = threading.Lock()
        self._listen_lock = threading.Lock()
        self._runner: threading.Thread | None = None
        self._cancel = threading.Event()
        self._plan: tuple[_Planned, ...] = ()
        self._idle = threading.Event()
        self._idle.set()
        self._unreachable_phases = 0

    def start(self) -> SimulatorServer:
        with self._control_lock, self._listen_lock:
            if self._started:
                raise RuntimeError("The simulator is already started.")
            self._httpd = _HTTPServer(self._port, self)
            # Pinned: every later listening period uses the same port.
            self._port = int(self._httpd.server_address[1])
            self._started = True
            self._serve()
        return self

    @property
    def port(self) -> int:
        if not self._started:
            raise RuntimeError("The simulator is not started.")
        return self._port

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def identity_endpoint(self) -> str:
        """What ``IDENTITY_ENDPOINT`` is set to for an app using this simulator."""
        return f"{self.url}/_identity/token"

    @property
    def listening(self) -> bool:
        """False during an unreachable phase (and after stop)."""
        return self._listening

    def effects(self) -> list[Effect]:
        return self.simulator.effects()

    def stats(self) -> dict[str, Any]:
        stats = self.simulator.stats()
        stats["unreachablePhases"] = self._unreachable_phases
        return stats

    def calls(self, since: str | datetime | None = None) -> list[dict[str, Any]]:
        """The call log (``simulator.calllog``): calls that arrived at or after ``since``."""
        return self.simulator.calls(since)

    def reset(self) -> None:
        self.simulator.reset()
        self.health.reset()

    # --- outages -----------------------------------------------------------------

    def start_outage(
        self, phases: Sequence[Phase], *, keep: socket.socket | None = None
    ) -> dict[str, Any]:
        """Run ``phases`` back to back from now, replacing any outage under way.

        Returns once the first phase is in force (for an unreachable one: the
        port refuses connections). ``keep`` is a connection not to cut (the one
        that asked, so it gets its answer). Returns ``outage_status()``.
        """
        phases = list(phases)
        if not phases:
            return self.end_outage()
        if total_seconds(phases) > MAX_OUTAGE_SECONDS:
            raise OutageError(f"An outage lasts at most {MAX_OUTAGE_SECONDS:g} s in all.")
        with self._control_lock:
            if not self._started or self._stopped:
                raise RuntimeError("The simulator is not running.")
            self._plan = ()  # the old outage thread must not signal idle
            self._cancel_runner()
            self._idle.clear()
            start = time.monotonic()
            plan: list[_Planned] = []
            for phase in phases:
                plan.append(_Planned(phase, start, start + phase.seconds))
                start += phase.seconds
            cancel = threading.Event()
            self._plan, self._cancel = tuple(plan), cancel
            self._enter(plan[0], keep)
            self._runner = threading.Thread(
                target=self._run_plan,
                args=(self._plan, cancel),
                name="simulator-outage",
                daemon=True,
            )
            self._runner.start()
            return self.outage_status()

    def outage(self, spec: Mapping[str, Any] | str) -> dict[str, Any]:
        """``start_outage`` from the JSON form of ``POST /_outage`` or the CLI form."""
        phases = parse_outage_cli(spec) if isinstance(spec, str) else parse_outage(dict(spec))
        return self.start_outage(phases) if phases else self.end_outage()

    def end_outage(self) -> dict[str, Any]:
        """End any outage now: calls are served and the port listens again."""
        with self._control_lock:
            self._cancel_runner()
            self._plan = ()
            self.simulator.outage.clear()
            self._listen()
            self._idle.set()
        return self.outage_status()

    def wait_outage_end(self, timeout: float) -> bool:
        """Wait until no outage is under way; False if ``timeout`` passed first."""
        return self._idle.wait(timeout)

    def outage_status(self) -> dict[str, Any]:
        """The phase in force and what follows, per the schedule's clock."""
        plan, now = self._plan, time.monotonic()
        for index, planned in enumerate(plan):
            if now < planned.end:
                status: dict[str, Any] = {"mode": planned.phase.mode}
                if planned.phase.mode == "error":
                    status["status"] = planned.phase.status
                    status["retryAfter"] = planned.phase.retry_after
                status["remainingSeconds"] = round(planned.end - now, 3)
                status["next"] = [later.phase.to_json() for later in plan[index + 1 :]]
                status["totalRemainingSeconds"] = round(plan[-1].end - now, 3)
                return status
        return {"mode": "off", "remainingSeconds": 0, "next": [], "totalRemainingSeconds": 0}

    def _run_plan(self, plan: tuple[_Planned, ...], cancel: threading.Event) -> None:
        try:
            for index, planned in enumerate(plan):
                if index:
                    if cancel.is_set():
                        break
                    self._enter(planned, None)
                if cancel.wait(max(0.0, planned.end - time.monotonic())):
                    break
        finally:
            self.simulator.outage.clear()
            self._listen()
            if self._plan is plan:
                self._plan = ()
                self._idle.set()
            self._log("outage over")

    def _enter(self, planned: _Planned, keep: socket.socket | None) -> None:
        phase = planned.phase
        if phase.mode == "error":
            self.simulator.outage.set_error(phase, until=planned.end)
            self._listen()
            self._log(f"outage: every call answered {phase.status} for {phase.seconds:g} s")
        else:
            self.simulator.outage.clear()
            self._unreachable_phases += 1
            self._unlisten(keep)
            self._log(f"outage: unreachable (connections refused) for {phase.seconds:g} s")

    def _cancel_runner(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            self._cancel.set()
            runner.join(timeout=RELISTEN_SECONDS + 5)

    # --- the listening socket ------------------------------------------------------

    def _serve(self) -> None:
        assert self._httpd is not None
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="simulator-http",
            daemon=True,
        )
        self._thread.start()
        self._listening = True

    def _unlisten(self, keep: socket.socket | None = None) -> None:
        """Close the listener (new connections are refused) and cut open connections."""
        with self._listen_lock:
            httpd = self._httpd
            if not self._listening or httpd is None:
                return
            self._listening = False
            httpd.stop_listening()
            httpd.shutdown()
            if self._thread is not None:
                self._thread.join(timeout=2)
            httpd.server_close()
            httpd.close_connections(keep)

    def _listen(self) -> None:
        """Listen again on the same port (SO_REUSEADDR), retrying for a bounded time."""
        with self._listen_lock:
            if self._listening or self._stopped or not self._started:
                return
            deadline = time.monotonic() + RELISTEN_SECONDS
            while True:
                try:
                    self._httpd = _HTTPServer(self._port, self)
                    break
                except OSError as exc:
                    if self._stopped or time.monotonic() >= deadline:
                        print(
                            f"simulator: cannot listen again on port {self._port}: {exc}",
                            file=sys.stderr,
                            flush=True,
                        )
                        return
                    time.sleep(0.05)
            self._serve()

    def _log(self, message: str) -> None:
        if self.verbose:
            print(f"simulator: {message}", file=sys.stderr, flush=True)

    def stop(self) -> None:
        """Stop promptly: hung calls wake and drop, idle connections are cut."""
        with self._control_lock:
            if not self._started or self._stopped:
                return
            self._stopped = True  # before the outage thread ends: it must not listen again
            self._cancel_runner()
        self.simulator.stop()
        self._unlisten()
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
