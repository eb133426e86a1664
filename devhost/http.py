"""HTTP triggers on 127.0.0.1, served and routed by werkzeug.

Routes are ``{routePrefix}/{route}`` with plain ``{name}`` parameters, the only kind the
app uses; a route with constraints, optional or catch-all parameters is refused at start.
A trailing slash is ignored. A path that matches a route with another method gets 405
(with ``Allow``), no route 404, both with a JSON ``error``. An unhandled exception in the
function gives 500 with a JSON ``error`` (Azure gives an empty 500).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

from werkzeug.exceptions import HTTPException, MethodNotAllowed
from werkzeug.routing import Map, Rule
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from devhost.app_loader import FunctionSpec
from devhost.invoke import Invoker, start_thread
from devhost.settings import ConfigError
from hostrun.shapes import HttpRequest, HttpResponse

log = logging.getLogger("devhost.http")
_PARAMETER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
#: Set by the server itself, never taken from the function's response.
_SERVER_HEADERS = ("content-length", "transfer-encoding", "connection")


def route_path(spec: FunctionSpec, prefix: str) -> str:
    """The URL path of ``spec``'s route, without the leading slash, as the host prints it."""
    template = str(spec.trigger.get("route") or spec.name)
    return "/".join(p for p in (prefix.strip("/"), template.strip("/")) if p)


def url_map(specs: Iterable[FunctionSpec], prefix: str) -> Map:
    """A werkzeug rule per function: ``{name}`` becomes ``<name>``."""
    rules = []
    for spec in specs:
        path = route_path(spec, prefix)
        rule = _PARAMETER.sub(r"<\1>", path)
        if "{" in rule or "}" in rule:
            raise ConfigError(
                f"function {spec.name!r}: route {path!r} has a parameter devhost does not "
                "serve; it serves plain {name} parameters only (no constraints, optional or "
                "catch-all ones)"
            )
        methods = spec.trigger.get("methods")  # none: every method
        rules.append(Rule(f"/{rule}", endpoint=spec.name, methods=methods or None))
    return Map(rules, strict_slashes=False, merge_slashes=False, redirect_defaults=False)


def to_response(result: Any) -> Response:
    """The response for what the function gave back (the runtime's ``RpcHttp``, as
    :class:`HttpResponse`); werkzeug's default Content-Type when it names none."""
    if isinstance(result, HttpResponse):
        headers = [(k, v) for k, v in result.headers.items() if k.lower() not in _SERVER_HEADERS]
        headers += [("Set-Cookie", cookie) for cookie in result.cookies]
        return Response(result.body, result.status, headers)
    raise TypeError(f"an HTTP function must return an HttpResponse, not {type(result).__name__}")


def json_error(status: int, message: str) -> Response:
    return Response(json.dumps({"error": message}), status, content_type="application/json")


class HttpServer:
    """The functions' routes on 127.0.0.1:``port`` (0: a free port), in a thread per request."""

    def __init__(
        self, port: int, specs: Iterable[FunctionSpec], prefix: str, invoker: Invoker
    ) -> None:
        self.specs = {spec.name: spec for spec in specs}
        self.urls = url_map(self.specs.values(), prefix)
        self.invoker = invoker
        try:
            self._server = make_server("127.0.0.1", port, self.wsgi, threaded=True)
        except (OSError, SystemExit) as error:  # werkzeug reports a busy port and exits
            raise ConfigError(
                f"cannot listen on 127.0.0.1:{port}; another devhost or func may use it: "
                "pass --http-port 0 for a free port"
            ) from error
        self.base_url = f"http://127.0.0.1:{self._server.port}"

    def wsgi(self, environ: dict[str, Any], start_response: Any) -> Any:
        request = Request(environ)
        try:
            name, params = self.urls.bind_to_environ(environ).match()
        except MethodNotAllowed as error:
            allowed = ", ".join(sorted(error.valid_methods or ()))
            response = json_error(
                405, f"{request.method} is not allowed on {request.path}; allowed: {allowed}"
            )
            response.headers["Allow"] = allowed
        except HTTPException:
            response = json_error(404, f"no function serves {request.method} {request.path}")
        else:
            response = self.invoke(self.specs[name], params, request)
        return response(environ, start_response)

    def invoke(self, spec: FunctionSpec, params: Mapping[str, str], request: Request) -> Response:
        target = request.environ.get("RAW_URI") or request.full_path
        trigger = HttpRequest(
            request.method,
            f"{self.base_url}{target}",
            headers=dict(request.headers.items()),  # repeated headers joined by the server
            query=dict(request.args.items(multi=True)),  # the last value wins
            route_params=params,
            body=request.get_data(),
        )
        outcome = self.invoker.call(spec, trigger, detail=f"{request.method} {target}")
        if outcome.error is not None:
            error = outcome.error
            return json_error(500, f"function {spec.name} failed: {type(error).__name__}: {error}")
        try:
            return to_response(outcome.value)
        except TypeError as error:
            log.error("function %s: %s", spec.name, error)
            return json_error(500, f"function {spec.name}: {error}")

    def start(self) -> None:
        start_thread("http", self._server.serve_forever, 0.2)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
