"""Per-key concurrency as operators see it (docs/contracts.md §3.16): the API's
``GET /api/orders/{id}`` and ``?turn=`` search, and the console's list and detail (the
key, the position, who holds the slot), through the HTTP functions on the in-memory
store."""

from __future__ import annotations

import html
import json
from collections.abc import Iterator
from typing import Any

import azure.functions as func
import pytest

from admin import triggers as api
from bootstrap import reset_app_context
from core.outcome import Outcome
from core.states import OrderStatus
from tests.support import declarations, on_devhost
from tests.unit.test_agent_pause import App, build
from tests.unit.test_console_workflows import get, text
from tests.unit.test_services_in_memory import reply_to


@pytest.fixture
def app() -> Iterator[App]:
    built = build()  # (the bootstrap puts the settings' declarations to use: then ours)
    reset_app_context(on_devhost(built.ctx))
    with declarations("tests.fixtures.turns"):
        for n in (1, 2, 3):
            built.submit(f"a-{n}", workflow="serial", account="acme")
            built.clock.advance(1)
        yield built
    reset_app_context(None)


def call(fn: Any, path: str, params: dict[str, str] | None = None, **route: str) -> Any:
    request = func.HttpRequest(
        "GET", f"http://h:7071/api/{path}", params=params or {}, route_params=route, body=b""
    )
    response = fn(request)
    assert response.status_code == 200, response.get_body()
    return json.loads(response.get_body())


def test_the_api_shows_the_key_the_position_and_the_holder(app: App) -> None:
    shown = call(api.get_order, "orders/a-3", orderId="a-3")

    assert shown["status"] == "pending" and shown["steps"] == []
    assert shown["waitingFor"] == [{"turn": "acme"}]
    assert shown["turn"] == {"key": "acme", "position": 2, "holders": ["a-1"], "waiting": 2}
    assert call(api.get_order, "orders/a-1", orderId="a-1")["turn"]["position"] == 0


def test_the_api_lists_the_orders_of_a_key(app: App) -> None:
    listed = call(api.list_orders, "orders", {"turn": "acme", "status": "pending"})

    assert [o["orderId"] for o in listed["orders"]] == ["a-3", "a-2"]
    assert listed["orders"][0]["waitingFor"] == [{"turn": "acme"}]


def test_the_console_shows_the_turn_and_links_the_holder(app: App) -> None:
    page = html.unescape(text(get("/orders/a-2", orderId="a-2")))

    assert 'id="turn" data-key="acme" data-position="1"' in page
    assert 'class="turn-holder" data-order-id="a-1"' in page
    assert "number 1 in line" in page and "2 waiting" in page
    assert '<li class="awaited" data-turn="acme">' in page
    assert "Waiting for its turn on key 'acme'" in page
    holder = html.unescape(text(get("/orders/a-1", orderId="a-1")))
    assert 'data-position="0"' in holder and "holds a slot" in holder


def test_the_console_list_marks_the_orders_that_wait_for_their_turn(app: App) -> None:
    page = html.unescape(text(get("", {"turn": "acme"})))

    assert page.count('data-turn="acme"') == 2  # a-2 and a-3; a-1 runs
    assert 'data-order-id="a-1"' in page


def test_a_resubmit_that_finds_the_key_taken_is_a_409_that_says_who_holds_it(app: App) -> None:
    [first] = [r for r in app.transport.requests if r.order_id == "a-1"]
    app.ctx.scheduler.apply_reply(reply_to(first, Outcome.REFUSED, error="no such account"))
    assert app.order("a-1").status is OrderStatus.ERROR  # a-2 took the slot
    request = func.HttpRequest(
        "POST",
        "http://h:7071/api/orders/a-1/resubmit",
        headers={"content-type": "application/json"},
        route_params={"orderId": "a-1"},
        body=json.dumps({"reason": "fixed the account"}).encode(),
    )

    response = api.resubmit_order(request)

    assert response.status_code == 409
    body = json.loads(response.get_body())
    assert body["reason"] == "turn-busy" and "a-2 running" in body["error"]
