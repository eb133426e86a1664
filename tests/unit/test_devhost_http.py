"""devhost HTTP: route templates, method filtering, responses, and a server in-process."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import azure.functions as func
import pytest

from devhost.app_loader import FunctionSpec
from devhost.http import (
    DevhostHttpServer,
    MethodNotAllowed,
    Router,
    compile_route,
    to_response,
)
from devhost.invoke import Invoker

ITEMS = "items/{category:alpha}/{id:int?}"


@pytest.mark.parametrize(
    ("template", "path", "params"),
    [
        ("orders/{orderId}", "/api/orders/o-1", {"orderId": "o-1"}),
        ("orders/{orderId}", "/api/ORDERS/o-1", {"orderId": "o-1"}),
        ("orders/{orderId}", "/api/orders/o-1/", {"orderId": "o-1"}),
        ("orders/{orderId}", "/api/orders/a%20b", {"orderId": "a b"}),
        ("orders/{orderId}", "/api/orders", None),
        ("orders/{orderId}", "/api/orders/a/b", None),
        ("orders/{orderId}", "/orders/o-1", None),
        (ITEMS, "/api/items/books/42", {"category": "books", "id": "42"}),
        (ITEMS, "/api/items/books", {"category": "books"}),
        (ITEMS, "/api/items/123/42", None),
        (ITEMS, "/api/items/books/x", None),
        ("files/{*rest}", "/api/files/a/b/c.txt", {"rest": "a/b/c.txt"}),
        ("v/{n:int:min(1)}", "/api/v/7", {"n": "7"}),
        ("v/{n:regex(^a$)}", "/api/v/anything", {"n": "anything"}),
        ("page/{n=1}", "/api/page", {"n": "1"}),
        ("file.{ext}", "/api/file.json", {"ext": "json"}),
    ],
)
def test_route_templates(template: str, path: str, params: dict[str, str] | None) -> None:
    assert compile_route(template, "api").match(path) == params


def test_empty_route_prefix() -> None:
    route = compile_route("orders/{id}", "")
    assert route.match("/orders/1") == {"id": "1"}
    assert route.match("/api/orders/1") is None


def test_literal_routes_win_over_parameters_and_methods_filter() -> None:
    router = Router(
        [
            compile_route("orders/{orderId}", "api", ["GET"]),
            compile_route("orders/search", "api", ["GET"]),
            compile_route("orders/{orderId}/resubmit", "api", ["POST"]),
        ]
    )
    found = router.match("GET", "/api/orders/search")
    assert found is not None
    assert found[0].template == "orders/search"
    found = router.match("get", "/api/orders/o-1")
    assert found is not None
    assert found[1] == {"orderId": "o-1"}
    with pytest.raises(MethodNotAllowed) as error:
        router.match("GET", "/api/orders/o-1/resubmit")
    assert error.value.allowed == ["POST"]
    assert router.match("GET", "/api/nothing") is None


def test_routes_without_methods_take_every_method() -> None:
    router = Router([compile_route("any", "api", None)])
    for method in ("GET", "POST", "DELETE", "PATCH"):
        assert router.match(method, "/api/any") is not None


def test_responses_are_encoded_as_the_worker_does() -> None:
    status, headers, body = to_response(func.HttpResponse("hi", status_code=202))
    assert (status, body) == (202, b"hi")
    assert ("Content-Type", "text/plain; charset=utf-8") in headers
    status, headers, body = to_response(
        func.HttpResponse(b"{}", mimetype="application/json", headers={"X-A": "1"})
    )
    assert ("Content-Type", "application/json") in headers
    assert ("X-A", "1") in headers
    assert to_response("text")[0] == 200
    assert to_response(None) == (204, [], b"")
    with pytest.raises(TypeError):
        to_response({"not": "a response"})


def http_spec(
    name: str,
    handler: Callable[..., Any],
    route: str,
    methods: list[str] | None,
    output: str = "$return",
) -> FunctionSpec:
    trigger: dict[str, Any] = {"type": "httpTrigger", "name": "req", "route": route}
    if methods:
        trigger["methods"] = methods
    return FunctionSpec(name, "httpTrigger", trigger, handler, "/app", http_output=output)


@pytest.fixture
def server() -> Iterator[DevhostHttpServer]:
    def get_order(req: func.HttpRequest) -> func.HttpResponse:
        body = {"route": dict(req.route_params), "query": dict(req.params), "url": req.url}
        return func.HttpResponse(json.dumps(body), mimetype="application/json")

    async def create(req: func.HttpRequest) -> func.HttpResponse:
        return func.HttpResponse(req.get_body(), status_code=201)

    def out_param(req: func.HttpRequest, res: func.Out[func.HttpResponse]) -> None:
        res.set(func.HttpResponse("via out", status_code=200))

    def fails(req: func.HttpRequest) -> func.HttpResponse:
        raise RuntimeError("no")

    specs = [
        http_spec("get_order", get_order, "orders/{orderId}", ["GET"]),
        http_spec("create", create, "orders", ["POST"]),
        http_spec("out_param", out_param, "out", None, output="res"),
        http_spec("fails", fails, "fails", None),
    ]
    from devhost.http import routes_for

    srv = DevhostHttpServer(0, Router(routes_for(specs, "api")), Invoker())
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def fetch(url: str, method: str = "GET", data: bytes | None = None) -> tuple[int, bytes, Any]:
    request = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read(), response.headers
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers


def test_server_calls_functions_and_maps_errors(server: DevhostHttpServer) -> None:
    base = server.base_url
    status, body, _ = fetch(f"{base}/api/orders/o-7?verbose=1")
    assert status == 200
    assert json.loads(body) == {
        "route": {"orderId": "o-7"},
        "query": {"verbose": "1"},
        "url": f"{base}/api/orders/o-7?verbose=1",
    }
    assert fetch(f"{base}/api/orders", "POST", b"payload")[:2] == (201, b"payload")
    assert fetch(f"{base}/api/out")[:2] == (200, b"via out")
    status, body, headers = fetch(f"{base}/api/orders/o-7", "DELETE")
    assert status == 405
    assert headers["Allow"] == "GET"
    status, body, _ = fetch(f"{base}/api/missing")
    assert status == 404
    assert "no function" in json.loads(body)["error"]
    status, body, _ = fetch(f"{base}/api/fails")
    assert status == 500
    assert "RuntimeError" in json.loads(body)["error"]
