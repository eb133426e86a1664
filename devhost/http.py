"""HTTP triggers on 127.0.0.1, served and routed by werkzeug.

Routes are ``{routePrefix}/{route}`` with plain ``{name}`` parameters (others are refused at
start); a trailing slash is ignored; 405 (with ``Allow``), 404 and a function's unhandled
exception (500; Azure's is empty) answer with a JSON ``error``. devhost answers as the
developer whoever asks, so it refuses what a web page could send (docs/local-development.md,
"Only your own pages"): a ``Host`` not its own (421, DNS rebinding), and a change whose
``Sec-Fetch-Site`` or ``Origin`` says another origin (403; ``Origin: null`` passes only with
``Sec-Fetch-Site: same-origin``, a no-referrer page's form). Clients without them are served.
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
_SERVER_HEADERS = ("content-length", "transfer-encoding", "connection")  # the server's own
_CHANGES = frozenset({"POST", "PUT", "PATCH", "DELETE"})  # what another origin may not send
_SAME_SITE = frozenset({"same-origin", "none"})  # Sec-Fetch-Site of a page's own request


def route_path(spec: FunctionSpec, prefix: str) -> str:
    """The URL path of ``spec``'s route, without the leading slash, as the host prints it."""
    template = str(spec.trigger.get("route") or spec.name).strip("/")
    return "/".join(p for p in (prefix.strip("/"), template) if p)


def url_map(specs: Iterable[FunctionSpec], prefix: str) -> Map:
    """A werkzeug rule per function: ``{name}`` becomes ``<name>``."""
    rules = []
    for spec in specs:
        path = route_path(spec, prefix)
        rule = _PARAMETER.sub(r"<\1>", path)
        if "{" in rule or "}" in rule:
            raise ConfigError(
                f"function {spec.name!r}: route {path!r}: devhost serves plain {{name}} route "
                "parameters only (no constraints, optional or catch-all ones)"
            )
        methods = spec.trigger.get("methods") or None  # none: every method
        rules.append(Rule(f"/{rule}", endpoint=spec.name, methods=methods))
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
        self.specs, self.prefix, self.invoker = {spec.name: spec for spec in specs}, prefix, invoker
        self.urls = url_map(self.specs.values(), prefix)
        try:
            self._server = make_server("127.0.0.1", port, self.wsgi, threaded=True)
        except (OSError, SystemExit) as error:  # werkzeug reports a busy port and exits
            raise ConfigError(
                f"cannot listen on 127.0.0.1:{port}; another devhost or func may use it: "
                "pass --http-port 0 for a free port"
            ) from error
        self.base_url = f"http://127.0.0.1:{self._server.port}"
        #: The ``Host`` values this server answers to, and so its own origins.
        self.hosts = frozenset(f"{name}:{self._server.port}" for name in ("127.0.0.1", "localhost"))

    def describe(self, spec: FunctionSpec) -> str:
        methods = ",".join(sorted(spec.trigger.get("methods") or [])) or "any method"
        auth = spec.trigger.get("authLevel", "FUNCTION")
        url = f"{self.base_url}/{route_path(spec, self.prefix)}"
        return f"{methods} {url} (authLevel {auth} not enforced locally)"

    def refusal(self, request: Request) -> Response | None:
        """421 for a ``Host`` that is not this server's, 403 for a change another origin
        sends (the module's docstring); None serves the request."""
        host = (request.headers.get("Host") or "").strip().lower()
        if host not in self.hosts:  # another name for this address: a page's DNS rebinding
            return json_error(421, f"devhost serves Host {' or '.join(sorted(self.hosts))} only")
        if request.method.upper() not in _CHANGES:
            return None
        site = (request.headers.get("Sec-Fetch-Site") or "").strip().lower()
        origin = (request.headers.get("Origin") or "").strip().lower()
        if site and site not in _SAME_SITE:
            return json_error(403, f"the browser says another origin sent this ({site[:40]})")
        if origin == "null" and site == "same-origin":
            return None  # the console's own form, from a no-referrer page
        if origin and origin.removeprefix("http://") not in self.hosts:
            return json_error(403, f"only devhost's own origin may post here, not {origin[:100]}")
        return None

    def wsgi(self, environ: dict[str, Any], start_response: Any) -> Any:
        request = Request(environ)
        if (refused := self.refusal(request)) is not None:
            seen = [request.headers.get(h) for h in ("Host", "Origin", "Sec-Fetch-Site")]
            what = "(Host %r, Origin %r, Sec-Fetch-Site %r)"
            log.warning(f"refused %s %s {what}", request.method, request.path, *seen)
            return refused(environ, start_response)
        try:
            name, params = self.urls.bind_to_environ(environ).match()
        except MethodNotAllowed as error:
            allowed = ", ".join(sorted(error.valid_methods or ()))
            what = f"{request.method} is not allowed on {request.path}"
            response = json_error(405, f"{what} ({allowed})")
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
        if (error := outcome.error) is not None:
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
