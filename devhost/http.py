"""HTTP triggers: routes as the Functions host reads them, served on 127.0.0.1.

Routes are ``{routePrefix}/{route}`` (prefix from host.json ``extensions.http.routePrefix``,
default ``api``); literal segments match case-insensitively; ``{name}`` parameters,
``{name?}`` optional and ``{*name}`` catch-all ones; constraints ``int``, ``long``,
``alpha``, ``bool``, ``guid``, ``decimal``/``double``/``float`` are enforced, others are
ignored (so such a route may match more locally than in Azure). A path that matches a
route with another method gets 405, no route 404, both with a JSON ``error``. An
unhandled exception in the function gives 500 with a JSON ``error`` (Azure gives an empty
500). Auth levels are not enforced, as with ``func start``.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import azure.functions as func

from devhost.app_loader import FunctionSpec
from devhost.invoke import Invoker, OutValue
from devhost.settings import ConfigError

log = logging.getLogger("devhost.http")

ALL_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "TRACE")
_CONSTRAINTS = {
    "int": r"-?\d+",
    "long": r"-?\d+",
    "alpha": r"[A-Za-z]+",
    "bool": r"(?:[Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee])",
    "guid": r"\{?[0-9A-Fa-f]{8}-?(?:[0-9A-Fa-f]{4}-?){3}[0-9A-Fa-f]{12}\}?",
    "decimal": r"-?\d+(?:\.\d+)?",
    "double": r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?",
    "float": r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?",
}
_PARAMETER = re.compile(
    r"\{(?P<star>\*{1,2})?(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"(?P<constraints>(?::[^{}?=]+)*)(?P<optional>\?)?(?:=(?P<default>[^{}]*))?\}"
)


@dataclass(frozen=True)
class Route:
    """One function's route: a compiled template, its methods and its precedence."""

    template: str
    pattern: re.Pattern[str]
    methods: frozenset[str]
    rank: tuple[int, ...]
    defaults: Mapping[str, str] = field(default_factory=dict)
    spec: FunctionSpec | None = None

    def match(self, path: str) -> dict[str, str] | None:
        found = self.pattern.match(path)
        if not found:
            return None
        params = {k: unquote(v) for k, v in found.groupdict().items() if v is not None}
        return {**self.defaults, **params}


def compile_route(
    template: str,
    prefix: str = "api",
    methods: Iterable[str] | None = None,
    spec: FunctionSpec | None = None,
) -> Route:
    """The route for ``template`` under ``prefix`` (both without leading/trailing slashes)."""
    parts = [p for p in f"{prefix.strip('/')}/{template.strip('/')}".split("/") if p]
    regex = ""
    rank: list[int] = []
    defaults: dict[str, str] = {}
    for part in parts:
        whole = _PARAMETER.fullmatch(part)
        if whole and (whole["optional"] or whole["star"] or whole["default"] is not None):
            if whole["default"] is not None:
                defaults[whole["name"]] = whole["default"]
            inner = ".*" if whole["star"] else _constraint_pattern(whole["constraints"])
            regex += f"(?:/(?P<{whole['name']}>{inner}))?"
            rank.append(5 if whole["star"] else 4)
            continue
        piece, last, kinds = "", 0, []
        for found in _PARAMETER.finditer(part):
            piece += re.escape(part[last : found.start()])
            piece += f"(?P<{found['name']}>{_constraint_pattern(found['constraints'])})"
            kinds.append(2 if found["constraints"] else 3)
            last = found.end()
        piece += re.escape(part[last:])
        if "{" in part[last:] or "}" in part[last:]:
            raise ConfigError(f"route {template!r}: cannot read the segment {part!r}")
        regex += "/" + piece
        rank.append(max(kinds) if kinds else 1)
    try:
        pattern = re.compile(f"^{regex}/?$", re.IGNORECASE)
    except re.error as error:
        raise ConfigError(f"route {template!r}: {error}") from error
    allowed = frozenset(m.upper() for m in methods) if methods else frozenset(ALL_METHODS)
    return Route(template, pattern, allowed, tuple(rank), defaults, spec)


def _constraint_pattern(constraints: str | None) -> str:
    for name in (constraints or "").split(":"):
        known = _CONSTRAINTS.get(name.strip().lower())
        if known:
            return known
    return r"[^/]+"


class MethodNotAllowed(Exception):
    def __init__(self, allowed: Iterable[str]) -> None:
        super().__init__("method not allowed")
        self.allowed = sorted(set(allowed))


class Router:
    """Picks the most specific matching route: literal before constrained before free
    parameters before optional and catch-all ones (ASP.NET's precedence, simplified)."""

    def __init__(self, routes: Iterable[Route]) -> None:
        self.routes = sorted(routes, key=lambda r: r.rank)

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]] | None:
        """The route and its parameters; None if no route; MethodNotAllowed if only others."""
        others: list[str] = []
        for route in self.routes:
            params = route.match(path)
            if params is None:
                continue
            if method.upper() in route.methods:
                return route, params
            others.extend(route.methods)
        if others:
            raise MethodNotAllowed(others)
        return None


def routes_for(specs: Iterable[FunctionSpec], prefix: str) -> list[Route]:
    routes = []
    for spec in specs:
        template = str(spec.trigger.get("route") or spec.name)
        methods = spec.trigger.get("methods")
        routes.append(compile_route(template, prefix, methods, spec))
    return routes


# --- request and response ----------------------------------------------------------------


def to_response(result: Any) -> tuple[int, list[tuple[str, str]], bytes]:
    """Status, headers and body for what the function gave back (as the worker encodes it)."""
    if isinstance(result, func.HttpResponse):
        headers = [(k, v) for k, v in result.headers.items()]
        if not any(k.lower() == "content-type" for k, _ in headers):
            mimetype = result.mimetype or "text/plain"
            charset = f"; charset={result.charset}" if mimetype.startswith("text/") else ""
            headers.append(("Content-Type", f"{mimetype}{charset}"))
        return result.status_code, headers, result.get_body() or b""
    if isinstance(result, str):
        return 200, [("Content-Type", "text/plain; charset=utf-8")], result.encode()
    if isinstance(result, bytes | bytearray):
        return 200, [("Content-Type", "application/octet-stream")], bytes(result)
    if result is None:
        return 204, [], b""
    raise TypeError(f"an HTTP function must return an HttpResponse, not {type(result).__name__}")


def json_error(status: int, message: str) -> tuple[int, list[tuple[str, str]], bytes]:
    return status, [("Content-Type", "application/json")], json.dumps({"error": message}).encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: DevhostHttpServer

    def _handle(self) -> None:
        split = urlsplit(self.path)
        try:
            found = self.server.router.match(self.command, split.path)
        except MethodNotAllowed as error:
            status, headers, body = json_error(
                405,
                f"{self.command} is not allowed on {split.path}; allowed: "
                f"{', '.join(error.allowed)}",
            )
            self._reply(status, [*headers, ("Allow", ", ".join(error.allowed))], body)
            return
        if found is None:
            self._reply(*json_error(404, f"no function serves {self.command} {split.path}"))
            return
        route, params = found
        assert route.spec is not None
        self._reply(*self._invoke(route.spec, params, split.query))

    def _invoke(
        self, spec: FunctionSpec, params: dict[str, str], query: str
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        headers: dict[str, str] = {}
        for key, value in self.headers.items():
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        request = func.HttpRequest(
            self.command,
            f"{self.server.base_url}{self.path}",
            headers=headers,
            params=dict(parse_qsl(query, keep_blank_values=True)),
            route_params=params,
            body=self._read_body(),
        )
        extra: dict[str, Any] = {}
        out = None
        if spec.http_output and spec.http_output != "$return":
            out = extra[spec.http_output] = OutValue()
        outcome = self.server.invoker.call(
            spec, request, extra, detail=f"{self.command} {self.path}"
        )
        if outcome.error is not None:
            error = outcome.error
            return json_error(500, f"function {spec.name} failed: {type(error).__name__}: {error}")
        try:
            return to_response(out.get() if out is not None else outcome.value)
        except TypeError as error:
            log.error("function %s: %s", spec.name, error)
            return json_error(500, f"function {spec.name}: {error}")

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline().strip():  # trailers
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _reply(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response(status)
        for key, value in headers:
            if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


for _method in ALL_METHODS:
    setattr(_Handler, f"do_{_method}", _Handler._handle)


class DevhostHttpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, router: Router, invoker: Invoker) -> None:
        try:
            super().__init__(("127.0.0.1", port), _Handler)
        except OSError as error:
            raise ConfigError(
                f"cannot listen on 127.0.0.1:{port} ({error}); another devhost or func may "
                "use it: pass --http-port 0 for a free port"
            ) from error
        self.router = router
        self.invoker = invoker
        self.base_url = f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> threading.Thread:
        thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.2}, name="http", daemon=True
        )
        thread.start()
        return thread

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
