"""devhost HTTP: routes as werkzeug rules, and the server in-process over real sockets."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from devhost.app_loader import FunctionSpec
from devhost.http import HttpServer, url_map
from devhost.settings import ConfigError
from hostrun.shapes import HttpRequest, HttpResponse
from tests.support import direct_invoker


def http_spec(
    name: str, handler: Callable[..., Any], route: str | None, methods: list[str] | None
) -> FunctionSpec:
    trigger: dict[str, Any] = {"type": "httpTrigger", "name": "req", "route": route}
    if methods:
        trigger["methods"] = methods
    return FunctionSpec(name, "httpTrigger", trigger, handler)


def nothing(req: HttpRequest) -> HttpResponse:
    return HttpResponse()


def match(specs: list[FunctionSpec], path: str, method: str = "GET", prefix: str = "api") -> Any:
    return url_map(specs, prefix).bind("localhost").match(path, method=method)


@pytest.mark.parametrize(
    ("path", "found"),
    [
        ("/api/orders/o-1", ("get_order", {"orderId": "o-1"})),
        ("/api/orders/o-1/", ("get_order", {"orderId": "o-1"})),
        ("/api/orders/search", ("search", {})),  # a literal wins over a parameter
        ("/api/console/orders/o-1/confirm", ("confirm", {"orderId": "o-1"})),
        ("/api/console/assets/app.css", ("asset", {"name": "app.css"})),
        ("/api/console", ("console", {})),
        ("/api/console/", ("console", {})),
    ],
)
def test_the_apps_route_shapes(path: str, found: tuple[str, dict[str, str]]) -> None:
    specs = [
        http_spec("get_order", nothing, "orders/{orderId}", ["GET"]),
        http_spec("search", nothing, "orders/search", ["GET"]),
        http_spec("confirm", nothing, "console/orders/{orderId}/confirm", ["GET"]),
        http_spec("asset", nothing, "console/assets/{name}", ["GET"]),
        http_spec("console", nothing, "console", ["GET"]),
    ]
    assert match(specs, path) == found


def test_the_function_name_is_the_default_route_and_the_prefix_may_be_empty() -> None:
    assert match([http_spec("hello", nothing, None, None)], "/api/hello") == ("hello", {})
    spec = http_spec("get", nothing, "orders/{id}", None)
    assert match([spec], "/orders/1", prefix="") == ("get", {"id": "1"})


@pytest.mark.parametrize("route", ["items/{id:int}", "items/{id?}", "files/{*rest}", "p/{n=1}"])
def test_routes_devhost_does_not_serve_are_refused(route: str) -> None:
    with pytest.raises(ConfigError, match="'items_or_files'"):
        url_map([http_spec("items_or_files", nothing, route, None)], "api")


@pytest.fixture
def server() -> Iterator[HttpServer]:
    def get_order(req: HttpRequest) -> HttpResponse:
        body = {
            "route": dict(req.route_params),
            "query": dict(req.query),
            "url": req.url,
            "host": req.headers.get("Host"),
            "cookie": req.headers.get("Cookie"),
        }
        headers = {"Content-Type": "application/json"}
        return HttpResponse(json.dumps(body).encode(), headers=headers)

    async def create(req: HttpRequest) -> HttpResponse:
        return HttpResponse(req.body, status=201)

    def page(req: HttpRequest) -> HttpResponse:
        headers = {"Content-Type": "text/html; charset=utf-8", "X-Frame-Options": "DENY"}
        return HttpResponse(b"<p>hi</p>", headers=headers, cookies=("console_csrf=t; HttpOnly",))

    def moved(req: HttpRequest) -> HttpResponse:
        return HttpResponse(status=303, headers={"Location": "/api/console?done=1"})

    def fails(req: HttpRequest) -> HttpResponse:
        raise RuntimeError("no")

    def wrong(req: HttpRequest) -> dict[str, str]:
        return {"not": "a response"}

    specs = [
        http_spec("get_order", get_order, "orders/{orderId}", ["GET"]),
        http_spec("create", create, "orders", ["POST"]),
        http_spec("page", page, "console", ["GET"]),
        http_spec("moved", moved, "console/orders/{orderId}/cancel", ["POST"]),
        http_spec("fails", fails, "fails", None),
        http_spec("wrong", wrong, "wrong", None),
    ]
    srv = HttpServer(0, specs, "api", direct_invoker())
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def test_functions_get_the_request(server: HttpServer) -> None:
    base = server.base_url
    response = httpx.get(f"{base}/api/orders/a%20b?verbose=1", headers={"Cookie": "c=1"})
    assert response.status_code == 200
    assert response.json() == {
        "route": {"orderId": "a b"},
        "query": {"verbose": "1"},
        "url": f"{base}/api/orders/a%20b?verbose=1",
        "host": base.removeprefix("http://"),
        "cookie": "c=1",
    }
    created = httpx.post(f"{base}/api/orders", content=b"payload")
    assert (created.status_code, created.content) == (201, b"payload")


def test_a_chunked_body_arrives_whole(server: HttpServer) -> None:
    chunks = iter([b"first,", b"second"])  # an iterator: httpx sends it chunked
    response = httpx.post(f"{server.base_url}/api/orders", content=chunks)
    assert (response.status_code, response.content) == (201, b"first,second")


def test_response_headers_html_and_redirects(server: HttpServer) -> None:
    response = httpx.get(f"{server.base_url}/api/console")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert response.headers["set-cookie"] == "console_csrf=t; HttpOnly"
    assert response.headers["x-frame-options"] == "DENY"
    assert response.text == "<p>hi</p>"
    moved = httpx.post(f"{server.base_url}/api/console/orders/o-1/cancel")
    assert moved.status_code == 303
    assert moved.headers["location"] == "/api/console?done=1"


def test_errors_are_json(server: HttpServer) -> None:
    base = server.base_url
    response = httpx.delete(f"{base}/api/orders/o-7")
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, HEAD"
    assert "DELETE is not allowed" in response.json()["error"]
    response = httpx.get(f"{base}/api/missing")
    assert response.status_code == 404
    assert "no function serves GET /api/missing" in response.json()["error"]
    response = httpx.get(f"{base}/api/fails")
    assert response.status_code == 500
    assert "RuntimeError: no" in response.json()["error"]
    response = httpx.get(f"{base}/api/wrong")
    assert response.status_code == 500
    assert "must return an HttpResponse" in response.json()["error"]


def test_a_busy_port_is_a_config_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match="--http-port 0"):
            HttpServer(port, [http_spec("x", nothing, "x", None)], "api", direct_invoker())


# --- what a page in the developer's browser may not do ------------------------------------


def test_a_foreign_host_is_refused_dns_rebinding(server: HttpServer) -> None:
    base, port = server.base_url, server.base_url.rsplit(":", 1)[1]
    for host in ("evil.example.com", f"evil.example.com:{port}", "127.0.0.1:1", "", "localhost"):
        response = httpx.get(f"{base}/api/orders/o-1", headers={"Host": host})
        assert response.status_code == 421, (host, response.status_code)
        assert "Host" in response.json()["error"]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}"):
        response = httpx.get(f"{base}/api/orders/o-1", headers={"Host": host})
        assert response.status_code == 200, host


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example.com", "Content-Type": "text/plain"},
        {"Origin": "http://127.0.0.1:1"},
        {"Origin": "null"},  # a sandboxed frame, a file: page
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
    ],
    ids=["other-site", "other-port", "null", "cross-site", "same-site"],
)
def test_a_change_from_another_origin_is_refused(
    server: HttpServer, headers: dict[str, str]
) -> None:
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        response = httpx.request(method, f"{server.base_url}/api/orders", headers=headers)
        assert response.status_code == 403, (method, response.status_code)
        assert "origin" in response.json()["error"]
    read = httpx.get(f"{server.base_url}/api/orders/o-1", headers=headers)
    assert read.status_code == 200  # a read changes nothing (the Host check guards reads)


def test_the_consoles_own_forms_and_clients_without_an_origin_may_change(
    server: HttpServer,
) -> None:
    base, port = server.base_url, server.base_url.rsplit(":", 1)[1]
    same = [
        {},  # the CLI, scripts, tests
        {"Origin": base},
        {"Origin": f"http://localhost:{port}", "Host": f"localhost:{port}"},
        {"Origin": "null", "Sec-Fetch-Site": "same-origin"},  # a no-referrer page's form
        {"Origin": base, "Sec-Fetch-Site": "same-origin"},
    ]
    for headers in same:
        created = httpx.post(f"{base}/api/orders", content=b"x", headers=headers)
        assert (created.status_code, created.content) == (201, b"x"), headers
