"""``POST /api/orders/{orderId}/resubmit`` with a patch (docs/contracts.md §3.14) through
the real triggers, on Azurite: the order's ``version`` and ``ETag``, the fixed data
stored and sent, a bad patch a 400 saying why, a stale ``If-Match`` a 412, and nothing
changed by either."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import azure.functions as func
import pytest

from bootstrap import AppContext, reset_app_context
from core.outcome import Outcome
from messaging.wire import decode_request
from tests.support import app_function, drain_requests, make_context
from tests.unit.test_services_in_memory import reply_to


@pytest.fixture
def ctx(storage_connection: str, tag: str) -> Iterator[AppContext]:
    context = make_context(storage_connection, tag)
    reset_app_context(context)
    yield context
    reset_app_context(None)


def call(
    function: str,
    order_id: str,
    body: Any = None,
    raw: bytes | None = None,
    if_match: str | None = None,
) -> tuple[int, Any, func.HttpResponse]:
    headers = {} if if_match is None else {"If-Match": if_match}
    payload = raw if raw is not None else b"" if body is None else json.dumps(body).encode()
    request = func.HttpRequest(
        method="GET" if function == "get_order" else "POST",
        url=f"http://localhost/api/orders/{order_id}",
        route_params={"orderId": order_id},
        body=payload,
        headers={"content-type": "application/json", "x-operator": "maria", **headers},
    )
    response: func.HttpResponse = app_function(function)(request)
    return response.status_code, json.loads(response.get_body()), response


def test_fix_and_resubmit_over_http(ctx: AppContext, tag: str) -> None:
    order_id = f"{tag}-fix"
    data = {"orderId": order_id, "address": {"zip": "1011", "lines": ["a" * 30_000]}}
    ctx.scheduler.submit(json.dumps(data).encode())
    [first] = [decode_request(t) for t in drain_requests(ctx)]
    ctx.scheduler.apply_reply(reply_to(first, Outcome.REFUSED, error="HTTP 400: zip"))
    status, shown, response = call("get_order", order_id)
    assert status == 200 and shown["status"] == "error"
    version = shown["version"]
    assert response.headers["ETag"] == f'"{version}"'

    # refused, each saying why; nothing changed
    for body, raw, says in [
        ({"patch": ["zip"]}, None, "JSON object"),
        ({"patch": None}, None, "JSON object"),
        ({"patch": {"orderId": "x"}}, None, "cannot change orderId"),
        ({"patch": {"big": "x" * 70_000}}, None, "characters"),
        (None, b"[" * 100_000, "must be JSON"),
        (None, b"{" + b" " * 300_000 + b"}", "bytes"),
    ]:
        status, answer, _ = call("resubmit_order", order_id, body, raw)
        assert status == 400 and says in answer["error"], (body, answer)
    status, answer, _ = call("resubmit_order", order_id, {"patch": {}}, if_match='"x1"')
    assert status == 400 and "If-Match" in answer["error"]
    status, answer, _ = call("resubmit_order", order_id, {"patch": {}}, if_match=f'"{version + 1}"')
    assert status == 412 and "changed since you read it" in answer["error"]
    assert ctx.store.load(order_id).version == version  # type: ignore[union-attr]

    # the fix: stored (the long address too), sent under a new key, kept in the history
    patch = {"address": {"zip": "10115"}, "note": "call first"}
    status, answer, _ = call(
        "resubmit_order",
        order_id,
        {"reason": "customer's zip", "patch": patch},
        if_match=f'"{version}"',
    )
    assert status == 200 and answer["status"] == "processing", answer
    order = ctx.store.load(order_id)
    assert order is not None
    assert order.body == {
        **data,
        "address": {"zip": "10115", "lines": ["a" * 30_000]},
        **{"note": "call first"},
    }
    assert order.content_hash != "" and order.version == version + 1
    ctx.scheduler.dispatch(order_id)
    [again] = [decode_request(t) for t in drain_requests(ctx)]
    assert again.idempotency_key == f"{order_id}:process:2"
    [patched] = [h for h in order.history if h["event"] == "patched"]
    assert patched["by"] == "function-key (claims: maria)"
    assert patched["changed"] == [
        {"field": "address.zip", "old": "1011", "new": "10115"},
        {"field": "note", "new": "call first"},
    ]
    # the second operator, who read the same version: told
    status, answer, _ = call("resubmit_order", order_id, {"patch": {}}, if_match=f'"{version}"')
    assert status == 412
